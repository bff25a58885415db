"""Losses of TMRNet and its self-supervised adaptation (paper Sec. 5; official ``syn_model.py`` / ``real_model.py``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ops.isp.process import HDR_SCALE, mu_tonemap


def synthetic_loss(out: Tensor, gt: Tensor) -> Tensor:
    """Supervised mu-law L1: ``|| mu(max(out / 16, 0)) - mu(clip(gt / 16, 0, 1)) ||_1`` (mean)."""
    return (mu_tonemap((out / HDR_SCALE).clamp(min=0.0)) - mu_tonemap((gt / HDR_SCALE).clamp(0.0, 1.0))).abs().mean()


def self_adapt_loss(outs: Sequence[Tensor], teacher_out: Tensor, t: int, w_self: float = 1.0) -> tuple[Tensor, Tensor]:
    """Self-supervised adaptation loss (paper Eqs. of Sec. 5.2: EMA-teacher term + temporally unbalanced term).

    ``L = || mu(y_T) - mu(y_teacher) ||_1 + w_self || mu(y_t) - sg(mu(y_T)) ||_1``, with ``y_i`` the student's
    output after ``i + 1`` frames, ``T`` the last one, ``t`` drawn uniformly from ``{0, 1, 2}`` by the caller and
    ``sg`` the stop-gradient: the few-frame outputs are pulled toward the student's own all-frame output.

    Args:
        outs: the student's outputs after each recurrence step, ``[B, 4, h, w]`` each.
        teacher_out: the teacher's all-frame output (no gradient).
        t: index of the few-frame output of the self term.
        w_self: its weight (1 officially; 0 ablates it).

    Returns:
        ``(total, self_term)``.
    """
    mu_last = mu_tonemap((outs[-1] / HDR_SCALE).clamp(min=0.0))
    mu_teacher = mu_tonemap((teacher_out.detach() / HDR_SCALE).clamp(min=0.0))
    ema_term = (mu_last - mu_teacher).abs().mean()
    self_term = (mu_tonemap((outs[t] / HDR_SCALE).clamp(min=0.0)) - mu_last.detach()).abs().mean()
    return ema_term + w_self * self_term, self_term


@torch.no_grad()
def ema_(teacher: nn.Module, student: nn.Module, decay: float = 0.999) -> None:
    """Mean-teacher update after every step: ``theta_t <- decay theta_t + (1 - decay) theta_s`` (buffers copied).

    Written as ``theta_t += (1 - decay) (theta_s - theta_t)``: identical student and teacher stay bit-identical (the
    difference is exactly 0), whereas ``theta_t * decay + (1 - decay) theta_s`` leaves a float32 rounding gap of
    ~1e-8 that the L1 self-supervision loss turns into full-size sign gradients."""
    for pt, ps in zip(teacher.parameters(), student.parameters(), strict=True):
        pt.add_(ps.detach() - pt, alpha=1.0 - decay)
    for bt, bs in zip(teacher.buffers(), student.buffers(), strict=True):
        bt.copy_(bs)
