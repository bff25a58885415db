"""PreWorld's forecasting-horizon curriculum and the weighted ray sampling of its rendering stage."""

from __future__ import annotations

import torch


def horizon_schedule(epoch: int, stage: str, max_horizon: int = 6) -> int:
    """Forecast steps K at 1-based ``epoch`` (official configs): pre-train K = 2 for epochs <= 2, then
    ``min(epoch - 1, 6)``; fine-tune K = 2 for epochs <= 4, then ``min((epoch - 3) // 2 + 1, 6)``; capped at
    ``max_horizon``."""
    if stage == "pretrain":
        k = 2 if epoch <= 2 else min(epoch - 1, 6)
    elif stage == "finetune":
        k = 2 if epoch <= 4 else min((epoch - 3) // 2 + 1, 6)
    else:
        raise ValueError(f"stage={stage!r} must be 'pretrain' or 'finetune'")
    return min(k, max_horizon)


def ray_sampling_weights(
    classes: torch.Tensor,
    frame_ids: torch.Tensor,
    dynamic: tuple[int, ...],
    w_adj: float = 0.3,
    w_dyn: float = 0.0,
    ignore_index: int = 255,
) -> torch.Tensor:
    """Per-ray sampling weights (official ``datasets/ray.py``): class balance ``exp(0.005 (max_count/count - 1))``,
    times ``w_adj`` for rays of adjacent frames (``frame_ids != 0``) and ``w_dyn`` for dynamic-class rays of adjacent
    frames. Rays without a class get the weight of the most frequent class. classes, frame_ids [R] -> [R]."""
    known = classes != ignore_index
    counts = torch.bincount(classes[known], minlength=1).to(torch.float64) if known.any() else torch.ones(1)
    present = counts > 0
    balance = torch.ones_like(counts)
    balance[present] = torch.exp(0.005 * (counts.max() / counts[present] - 1.0))
    w = torch.ones(classes.shape, dtype=torch.float64, device=classes.device)
    w[known] = balance[classes[known]]
    adj = frame_ids != 0
    w = torch.where(adj, w * w_adj, w)
    dyn = torch.zeros_like(adj)
    for c in dynamic:
        dyn |= classes == c
    return torch.where(adj & dyn, w * w_dyn / max(w_adj, 1e-12), w)
