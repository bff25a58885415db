"""Leaderboard table and PNG plots of a fitted ranking model (headless matplotlib).

* ``scores.png``: scores with +-1.96 standard-error bars, by rank.
* ``match_matrix.png``: observed vs predicted P(win) and P(tie) among the top competitors.
* ``kpca_map.png`` (``k_cov >= 1``): 2-D kernel-PCA map of the Thurstonian distances
  ``d_ij = |x_i - x_j| / sqrt(S_ii + S_jj - 2 S_ij)`` (``S`` doubly centred), as the paper's ``map_distance``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_modules.leaderbot import likelihoods as lk


def leaderboard_rows(
    names: list[str],
    scores: torch.Tensor,
    stderr: torch.Tensor | None,
    pairs: torch.Tensor,
    counts: torch.Tensor,
    probs: torch.Tensor,
) -> list[dict[str, Any]]:
    """Rows sorted by decreasing score (ties broken by name).

    Args:
        names: ``m`` competitor names.
        scores: ``[m]``.
        stderr: ``[m]`` or ``None``.
        pairs: ``[n, 2]``; counts: ``[n, 3]``; probs: ``[n, 3]`` predicted.
    """
    m = len(names)
    obs = lk.competitor_counts(pairs.cpu(), counts.cpu().double(), m)
    pred_counts = counts.sum(-1, keepdim=True).cpu().double() * probs.cpu().double()
    pred = lk.competitor_counts(pairs.cpu(), pred_counts, m)
    games = obs.sum(-1)
    x = scores.detach().cpu().double()
    order = sorted(range(m), key=lambda i: (-float(x[i]), names[i]))
    rows = []
    for rank, i in enumerate(order, 1):
        g = max(float(games[i]), 1.0)
        rows.append(
            {
                "rank": rank,
                "model": names[i],
                "score": float(x[i]),
                "stderr": float("nan") if stderr is None else float(stderr[i]),
                "games": int(games[i]),
                "obs_win": float(obs[i, 0]) / g,
                "obs_loss": float(obs[i, 1]) / g,
                "obs_tie": float(obs[i, 2]) / g,
                "pred_win": float(pred[i, 0]) / g,
                "pred_loss": float(pred[i, 1]) / g,
                "pred_tie": float(pred[i, 2]) / g,
            }
        )
    return rows


def write_leaderboard_csv(rows: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_scores(rows: list[dict[str, Any]], path: Path) -> Path:
    plt = _plt()
    m = len(rows)
    fig, ax = plt.subplots(figsize=(7, 0.13 * m + 1.2))
    y = np.arange(m)
    s = np.array([r["score"] for r in rows])
    e = np.array([r["stderr"] for r in rows])
    ax.errorbar(s, y, xerr=np.where(np.isfinite(e), 1.96 * e, 0.0), fmt="o", ms=2.5, lw=0.8, capsize=1.5)
    ax.set_yticks(y, [r["model"] for r in rows], fontsize=5)
    ax.invert_yaxis()
    ax.set_xlabel("score x (95% interval from the observed Fisher information)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def plot_match_matrix(
    rows: list[dict[str, Any]],
    names: list[str],
    w: torch.Tensor,
    layout: lk.Layout,
    basis: torch.Tensor,
    pairs: torch.Tensor,
    counts: torch.Tensor,
    top: int,
    path: Path,
) -> Path:
    plt = _plt()
    top_names = [r["model"] for r in rows[:top]]
    idx = [names.index(n) for n in top_names]
    k = len(idx)
    ii, jj = np.meshgrid(idx, idx, indexing="ij")
    grid = torch.as_tensor(np.stack([ii.ravel(), jj.ravel()], 1), dtype=torch.int64)
    with torch.no_grad():
        prob = lk.probabilities(w, grid, layout, basis).reshape(k, k, 3).numpy()
    obs = np.full((k, k, 3), np.nan)
    pos = {g: a for a, g in enumerate(idx)}
    for (a, b), c in zip(pairs.tolist(), counts.tolist()):
        if a in pos and b in pos and sum(c) > 0:
            p = np.array(c) / sum(c)
            obs[pos[a], pos[b]] = p
            obs[pos[b], pos[a]] = p[[1, 0, 2]]
    np.fill_diagonal(prob[..., 0], np.nan)
    np.fill_diagonal(prob[..., 2], np.nan)
    panels = [(obs[..., 0], "observed P(win)"), (prob[..., 0], "predicted P(win)")]
    if layout.has_tie:
        panels += [(obs[..., 2], "observed P(tie)"), (prob[..., 2], "predicted P(tie)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.6))
    for ax, (mat, title) in zip(np.atleast_1d(axes), panels):
        im = ax.imshow(mat, cmap="viridis", vmin=0, vmax=1 if "win" in title else np.nanmax(prob[..., 2]) + 1e-9)
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(k), top_names, rotation=90, fontsize=4)
        ax.set_yticks(range(k), top_names, fontsize=4)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def thurstonian_distance(x: torch.Tensor, cov: torch.Tensor) -> torch.Tensor:
    """``[m, m]`` distances ``|x_i - x_j| / sqrt(S_ii + S_jj - 2 S_ij)`` (0 on the diagonal)."""
    d = torch.diagonal(cov)
    var = (d[:, None] + d[None, :] - 2.0 * cov).clamp_min(1e-300)
    out = (x[:, None] - x[None, :]).abs() / var.sqrt()
    out.fill_diagonal_(0.0)
    return out


def plot_kpca_map(
    rows: list[dict[str, Any]], names: list[str], x: torch.Tensor, cov: torch.Tensor, top: int, path: Path
) -> Path:
    """Kernel PCA (precomputed kernel ``-1/2 C D^2 C``) of the Thurstonian distances, top competitors labelled."""
    from sklearn.decomposition import KernelPCA

    plt = _plt()
    dist = thurstonian_distance(x, cov).numpy()
    m = dist.shape[0]
    c = np.eye(m) - 1.0 / m
    kernel = -0.5 * c @ (dist**2) @ c
    emb = KernelPCA(n_components=2, kernel="precomputed").fit_transform(kernel)
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    sc = ax.scatter(emb[:, 0], emb[:, 1], c=x.numpy(), cmap="coolwarm", s=12)
    for r in rows[:top]:
        i = names.index(r["model"])
        ax.annotate(r["model"], emb[i], fontsize=5)
    fig.colorbar(sc, ax=ax, label="score")
    ax.set_title("kernel-PCA map of Thurstonian distances")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def make_plots(
    out: Path,
    rows: list[dict[str, Any]],
    names: list[str],
    w: torch.Tensor,
    layout: lk.Layout,
    basis: torch.Tensor,
    pairs: torch.Tensor,
    counts: torch.Tensor,
    cov: torch.Tensor | None,
    top: int,
) -> list[Path]:
    """Write the plots into ``out``; returns their paths."""
    top = min(top, len(names))
    paths = [
        plot_scores(rows, out / "scores.png"),
        plot_match_matrix(rows, names, w, layout, basis, pairs, counts, top, out / "match_matrix.png"),
    ]
    if cov is not None and layout.k_cov and layout.k_cov >= 1 and math.isfinite(float(cov.sum())):
        paths.append(plot_kpca_map(rows, names, w[: layout.m], cov, top, out / "kpca_map.png"))
    return paths
