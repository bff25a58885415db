"""The ``cosine_warmup`` learning-rate schedule of the official BracketIRE training (linear warm-up, cosine decay)."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def cosine_warmup_factor(step: int, warmup_steps: int, total_steps: int, min_factor: float = 0.0) -> float:
    """``(step + 1) / warmup`` during the warm-up, then ``min + (1 - min) (1 + cos(pi p)) / 2`` with ``p`` the
    fraction of the remaining steps done; ``total_steps <= 0`` (no step budget, e.g. a debug run) stays at 1."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if total_steps <= 0:
        return 1.0
    p = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_factor + (1.0 - min_factor) * 0.5 * (1.0 + math.cos(math.pi * p))


def cosine_warmup(
    optimizer: torch.optim.Optimizer, warmup_steps: int = 0, total_steps: int = -1, min_factor: float = 0.0
) -> LambdaLR:
    """A per-step :class:`LambdaLR` of :func:`cosine_warmup_factor` (use with ``scheduler_interval: step``)."""
    return LambdaLR(optimizer, lambda s: cosine_warmup_factor(s, warmup_steps, total_steps, min_factor))
