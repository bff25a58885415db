"""Correctional guidance (ADDP insight 3): classifier-free guidance with a user's correction.

Our interpretation (the paper's formula was not recovered). With the unconditional, conditional and negative
(correction) predictions

    e = e_u + w (e_c - e_u) - w_neg (e_n - e_u)

(Ho & Salimans 2022 for ``w``; a negative prompt for ``w_neg``; a refined expression or click enters as the new
``e_c``). ``e`` may be noise or data (x0) predictions: eps = (x - D) / sigma is affine in D with the same x and sigma,
and the weights of the combination sum to 1, so the two forms give the same guided step.
"""

from __future__ import annotations

from torch import Tensor


def correctional_cfg(
    pred_cond: Tensor, pred_uncond: Tensor, pred_neg: Tensor | None = None, w: float = 1.0, w_neg: float = 0.0
) -> Tensor:
    """Guided prediction ``e_u + w (e_c - e_u) - w_neg (e_n - e_u)`` (all [B, ...]; ``pred_neg=None``: plain CFG)."""
    out = pred_uncond + w * (pred_cond - pred_uncond)
    if pred_neg is not None and w_neg != 0.0:
        out = out - w_neg * (pred_neg - pred_uncond)
    return out
