"""Image-text retrieval metrics of TULIP (Sec. 4): I2T / T2I Recall@K over a gallery, and R@1 by caption length.

Pair ``i`` is image ``i`` with caption ``i``; a query is a hit at K when its own pair ranks in the top K of the
similarity row. Vectorised (one ranking per query, ties counted against the query); tested against torchmetrics'
``RetrievalRecall``.
"""

from __future__ import annotations

import torch


def pair_ranks(sim: torch.Tensor) -> torch.Tensor:
    """0-based rank of the true pair of each query row of ``sim`` ``[N, N]`` (ties: the pessimistic rank)."""
    own = sim.diagonal()[:, None]
    others = sim.clone()
    others.fill_diagonal_(float("-inf"))
    return (others >= own).sum(1)


def recall_at_k(image_features: torch.Tensor, text_features: torch.Tensor, ks: tuple[int, ...] = (1, 5, 10)) -> dict:
    """``{"i2t_r1": ..., "t2i_r10": ...}``: the fraction of queries whose pair ranks in the top K (percent)."""
    sim = image_features @ text_features.T
    out = {}
    for direction, ranks in (("i2t", pair_ranks(sim)), ("t2i", pair_ranks(sim.T))):
        for k in ks:
            out[f"{direction}_r{k}"] = 100.0 * (ranks < k).float().mean().item()
    return out


def r1_by_length(
    image_features: torch.Tensor, text_features: torch.Tensor, lengths: torch.Tensor, edges: list[int]
) -> dict[str, tuple[float, int]]:
    """Mean of I2T and T2I R@1 (percent) over the pairs whose caption length (tokens) falls in each bin
    ``[edges[j-1], edges[j])``; keys ``lt<e0>``, ``<e0>_<e1>``, ..., ``ge<eK>``; values ``(R@1, count)``."""
    sim = image_features @ text_features.T
    hit = ((pair_ranks(sim) == 0).float() + (pair_ranks(sim.T) == 0).float()) / 2
    bounds = [0, *edges, 10**9]
    out = {}
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        name = f"lt{hi}" if lo == 0 else (f"ge{lo}" if hi == 10**9 else f"{lo}_{hi}")
        sel = (lengths >= lo) & (lengths < hi)
        if sel.any():
            out[name] = (100.0 * hit[sel].mean().item(), int(sel.sum()))
    return out
