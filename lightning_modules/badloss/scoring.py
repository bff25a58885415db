"""BaDLoss scoring: epoch filtering, kNN distance to clean-probe trajectories, ranks, rejection (paper Sec. 3).

Notation: ``L in R^{N x E}`` holds the loss trajectory of every training example over ``E`` recorded epochs,
``C in R^{M x E}`` those of the defender's clean probes.

* Epoch filter: keep epochs 0, 1, 2; keep epoch ``i >= 3`` iff ``mean_i < 2 * mean(last three kept means)``
  (drops the loss spikes frequent with many simultaneous attacks).
* Eq. (1) anomaly score: ``d_n = (1/k) sum_{c in kNN_k(L_n; C)} ||L_n - C_c||_2``; ``s_n = log(eps + d_n)``
  (or ``d_n`` with linear scores), min-max normalised to ``[0, 1]``.
* Rank-based rejection: ranks ``r_n in [0, 1]`` (``linspace`` over the sort order); reject ``r_n > 1 - rho``
  (``rho = 0.4`` by default).
* Two-class variant (arXiv v1 / MAP-D): score = share of backdoor probes among the ``k`` nearest probe
  trajectories (clean and backdoor probes pooled).

``knn_mean_distance`` is the fast (``cdist`` + ``topk``) path, ``knn_mean_distance_naive`` its loop twin. Both
compute distances in float64 whatever the input dtype, and ``cdist`` takes the direct difference form (not the
``|a|^2 + |b|^2 - 2 a.b`` matrix-product form, which in float32 turns a self-distance of 0 into ~0.008 on
loss-sized values and swaps neighbour ranks): a trajectory's distance to its own copy is exactly 0, as with sklearn.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from core.errors import ConfigError


def filter_epochs(traj: torch.Tensor) -> list[int]:
    """Epochs kept by the spike filter. ``traj``: ``[N, E]`` losses -> sorted epoch indices."""
    means = traj.double().mean(0).tolist()
    kept = list(range(min(3, len(means))))
    for i in range(3, len(means)):
        if means[i] < 2.0 * float(np.mean([means[j] for j in kept[-3:]])):
            kept.append(i)
    return kept


def pairwise_distances(query: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Euclidean distances ``[N, M]`` in float64 (direct differences, no matrix-product shortcut)."""
    return torch.cdist(query.double(), ref.double(), compute_mode="donot_use_mm_for_euclid_dist")


def knn_mean_distance(query: torch.Tensor, ref: torch.Tensor, k: int) -> torch.Tensor:
    """Mean Euclidean distance of each query row to its ``k`` nearest ``ref`` rows. ``[N, E], [M, E] -> [N]``
    (float64)."""
    if not 1 <= k <= len(ref):
        raise ConfigError(f"model.k={k} must be in [1, number of clean probes = {len(ref)}]")
    d = pairwise_distances(query, ref)  # [N, M]
    return d.topk(k, dim=1, largest=False).values.mean(1)


def knn_mean_distance_naive(query: torch.Tensor, ref: torch.Tensor, k: int) -> torch.Tensor:
    """Loop twin of :func:`knn_mean_distance` (one query at a time, full sort, float64)."""
    query, ref = query.double(), ref.double()
    out = []
    for q in query:
        dist = ((ref - q) ** 2).sum(1).sqrt()
        out.append(dist.sort().values[:k].mean())
    return torch.stack(out)


def minmax(x: torch.Tensor) -> torch.Tensor:
    """Min-max normalisation to ``[0, 1]`` (all zeros when constant)."""
    span = x.max() - x.min()
    return (x - x.min()) / span if span > 0 else torch.zeros_like(x)


def anomaly_scores(
    traj: torch.Tensor, clean_traj: torch.Tensor, k: int = 50, eps: float = 0.01, log: bool = True
) -> torch.Tensor:
    """Eq. (1): min-max normalised ``log(eps + mean kNN distance to clean probes)``. ``[N, E], [M, E] -> [N]``."""
    d = knn_mean_distance(traj, clean_traj, k)
    return minmax(torch.log(eps + d) if log else d)


def two_class_scores(traj: torch.Tensor, clean_traj: torch.Tensor, backdoor_traj: torch.Tensor, k: int = 20):
    """Two-class kNN: share of backdoor probes among the ``k`` nearest pooled probes. ``-> [N]`` in ``[0, 1]``."""
    ref = torch.cat([clean_traj, backdoor_traj])
    if not 1 <= k <= len(ref):
        raise ConfigError(f"model.two_class_k={k} must be in [1, number of probes = {len(ref)}]")
    is_bd = torch.cat([torch.zeros(len(clean_traj)), torch.ones(len(backdoor_traj))]).double()
    nearest = pairwise_distances(traj, ref).topk(k, dim=1, largest=False).indices
    return is_bd[nearest].mean(1)


def scores_to_ranks(scores: torch.Tensor) -> torch.Tensor:
    """Rank of each score mapped to ``linspace(0, 1, N)`` (lowest score -> 0, highest -> 1; stable ties)."""
    order = torch.argsort(scores, stable=True)
    ranks = torch.empty(len(scores), dtype=torch.float64)
    ranks[order] = torch.linspace(0.0, 1.0, len(scores), dtype=torch.float64)
    return ranks


def select_keep(ranks: torch.Tensor, reject_frac: float) -> torch.Tensor:
    """Indices with rank ``<= 1 - reject_frac`` (the ``reject_frac`` highest-scored examples are dropped)."""
    if not 0.0 <= reject_frac < 1.0:
        raise ConfigError(f"model.reject_frac={reject_frac} must be in [0, 1)")
    return torch.nonzero(ranks <= 1.0 - reject_frac + 1e-12).squeeze(1)


def roc_auc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """ROC AUC of ``scores`` for the ``positive`` mask (sklearn); NaN when one class is empty."""
    p = positive.bool().cpu().numpy()
    if p.all() or not p.any():
        return float("nan")
    return float(roc_auc_score(p, scores.double().cpu().numpy()))


def badloss_scores(
    traj: torch.Tensor,
    clean_probes: torch.Tensor,
    k: int = 50,
    eps: float = 0.01,
    log: bool = True,
    use_filter: bool = True,
) -> tuple[torch.Tensor, list[int]]:
    """The one-class BaDLoss detector on a recorded loss matrix, whatever model recorded it.

    Epoch filter (optional), then Eq. (1) against the clean-probe rows, ``k`` capped at the probe count (as the
    official code's ``min(k, M)``). Used by :class:`~lightning_modules.badloss.BadlossLitModule` at detection time and
    by the cross-paper study ``badloss_vit`` on another module's :class:`callbacks.loss_dynamics.LossDynamics` matrix.

    Args:
        traj: ``[N, E]`` per-example losses (row = example index, column = recorded epoch).
        clean_probes: boolean mask ``[N]`` or row indices of the defender's clean probes.

    Returns:
        ``(scores [N] in [0, 1] (float64), kept epoch indices)``.
    """
    traj = traj.double()
    epochs = filter_epochs(traj) if use_filter else list(range(traj.shape[1]))
    t = traj[:, epochs]
    ref = t[clean_probes]
    if len(ref) == 0:
        raise ConfigError("BaDLoss needs clean probes (data.num_probes >= 1)")
    return anomaly_scores(t, ref, min(k, len(ref)), eps, log), epochs


def detection_aucs(
    scores: torch.Tensor, poison_attack: torch.Tensor, attack_names: list[str] | tuple[str, ...]
) -> dict[str, float]:
    """The suite's detection metrics (the paper's convention): ``detect/auc`` of the scores against "poisoned by any
    attack", and per attack ``detect/auc_<name>``: that attack's poisons vs the clean examples (the other attacks'
    poisons left out). ``scores``, ``poison_attack`` (attack index, -1 clean): ``[N]`` over the scored rows only."""
    out = {"detect/auc": roc_auc(scores, poison_attack >= 0)}
    for a_id, name in enumerate(attack_names):
        sel = (poison_attack == a_id) | (poison_attack < 0)
        out[f"detect/auc_{name}"] = roc_auc(scores[sel], poison_attack[sel] == a_id)
    return out


def scored_mask(num_original: int, train_rows: torch.Tensor | None) -> torch.Tensor:
    """Mask ``[num_original]`` of the originals that are ranked and counted in the detection metrics: those the
    detection phase trained on (``train_rows``, full-set row indices; ``None``: all). With clean-probe copies that
    replace their originals the originals are left out, as in the official code."""
    mask = torch.zeros(num_original, dtype=torch.bool)
    if train_rows is None:
        mask[:] = True
    else:
        train_rows = torch.as_tensor(train_rows, dtype=torch.long)
        mask[train_rows[train_rows < num_original]] = True
    return mask
