"""Heaviside spike with the ATan surrogate gradient (Fang et al., 2021), as used by TS-LIF.

Forward: ``S = H(x) = 1[x >= 0]`` (Eq. (4), the firing rule). Backward: the derivative of the smooth primitive
``g(x) = atan(pi/2 * alpha * x) / pi + 1/2``, i.e. ``g'(x) = alpha / 2 / (1 + (pi/2 * alpha * x)^2)`` (Eq. (5)).
The official code uses spikingjelly's ``surrogate.ATan(alpha=2)``.
"""

from __future__ import annotations

import math

import torch


def atan_surrogate_grad(x: torch.Tensor, alpha: float = 2.0) -> torch.Tensor:
    """Surrogate derivative ``alpha / 2 / (1 + (pi/2 * alpha * x)^2)`` (Eq. (5)); any shape, same shape out."""
    return (alpha / 2) / (1 + (math.pi / 2 * alpha * x) ** 2)


def atan_primitive(x: torch.Tensor, alpha: float = 2.0) -> torch.Tensor:
    """Smooth primitive ``atan(pi/2 * alpha * x) / pi + 1/2`` whose derivative is the surrogate gradient."""
    return torch.atan(math.pi / 2 * alpha * x) / math.pi + 0.5


class ATanSpike(torch.autograd.Function):
    """Heaviside forward, ATan surrogate backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, alpha: float) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x)
        ctx.alpha = alpha
        return (x >= 0).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        (x,) = ctx.saved_tensors
        return grad * atan_surrogate_grad(x, ctx.alpha), None


def spike(x: torch.Tensor, alpha: float = 2.0) -> torch.Tensor:
    """Binary spikes ``1[x >= 0]`` of any shape, differentiable through the ATan surrogate (Eqs. (4)-(5))."""
    return ATanSpike.apply(x, alpha)
