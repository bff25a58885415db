"""Lipschitz constant of a (learned or exact) score, and the sharp bounds of Mooney, Wang, Xin & Yu (sgm_lipschitz).

Notation. OU forward process X_t = e^{-t} X_0 + sqrt(1 - e^{-2t}) Z. Since e^t X_t = X_0 + sqrt(v) Z with
v = e^{2t} - 1 (:func:`ou_to_heat`), the OU marginal is a rescaled heat-flow marginal q_v = p_0 * N(0, v I) and

    grad^2 log p_t(x) = e^{2t} grad^2 log q_v(e^t x).

Bounds (our reconstruction of the paper's Theorem 3.1, see docs/methods/sgm_lipschitz.md; the paper's math was not
recoverable offline, so these are stated as derived): if grad^2 log p_0 <= K I (K > 0), then
grad^2 log q_v <= K / (1 - K v) I for v < 1/K (:func:`semiconvex_bound`, finite only for t < t* = ln(1 + 1/K) / 2);
if grad^2 log p_0 >= -L I, then grad^2 log q_v >= -L / (1 + L v) I for all v (:func:`lower_hessian_bound`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor


def ou_to_heat(t: Tensor | float) -> Tensor:
    """Heat time v = e^{2t} - 1 of OU time t."""
    return torch.expm1(2 * torch.as_tensor(t, dtype=torch.float64))


def semiconvex_bound(k: float, t: Tensor | float) -> Tensor:
    """Upper bound on lambda_max(grad^2 log p_t): K e^{2t} / (1 - K (e^{2t} - 1)); +inf for t >= t*."""
    t = torch.as_tensor(t, dtype=torch.float64)
    den = 1 - k * ou_to_heat(t)
    out = k * torch.exp(2 * t) / den
    return torch.where(den > 0, out, torch.full_like(out, math.inf))


def blowup_time(k: float) -> float:
    """t* = ln(1 + 1/K) / 2, the end of the interval on which the semiconvexity bound is finite."""
    return 0.5 * math.log1p(1.0 / k)


def lower_hessian_bound(lip: float, t: Tensor | float) -> Tensor:
    """Lower bound on lambda_min(grad^2 log p_t): -L e^{2t} / (1 + L (e^{2t} - 1))."""
    t = torch.as_tensor(t, dtype=torch.float64)
    return -lip * torch.exp(2 * t) / (1 + lip * ou_to_heat(t))


def heat_hessian_1d(x0: Tensor, logp0: Tensor, y: Tensor, v: float) -> Tensor:
    """d^2/dy^2 log q_v(y) for a 1-D density given on a uniform quadrature grid.

    With the posterior x_0 | y ~ p_0(x_0) N(y; x_0, v): d^2 log q_v = Var[x_0 | y] / v^2 - 1 / v.

    Args:
        x0: Quadrature nodes [M] (uniform).
        logp0: Unnormalised log p_0 at the nodes [M].
        y: Query points [Q].
        v: Heat time (> 0).

    Returns:
        [Q] float64.
    """
    logw = logp0[None, :] - (y[:, None] - x0[None, :]) ** 2 / (2 * v)  # [Q, M]
    w = torch.softmax(logw, dim=1)
    m1 = (w * x0).sum(1)
    var = (w * (x0[None] - m1[:, None]) ** 2).sum(1)
    return var / v**2 - 1.0 / v


def heat_hessian_points(pts: Tensor, logw0: Tensor, y: Tensor, v: float) -> Tensor:
    """grad^2 log q_v(y) for p_0 given by weighted points (quadrature of a manifold measure): Cov[x_0|y]/v^2 - I/v.

    Args:
        pts: Nodes [M, d]; logw0: log quadrature weights [M]; y: queries [Q, d]; v: heat time.

    Returns:
        [Q, d, d].
    """
    logw = logw0[None] - ((y[:, None, :] - pts[None]) ** 2).sum(-1) / (2 * v)
    w = torch.softmax(logw, dim=1)
    m = w @ pts
    c = pts[None] - m[:, None]
    cov = torch.einsum("qm,qmd,qme->qde", w, c, c)
    return cov / v**2 - torch.eye(pts.shape[1], dtype=pts.dtype) / v


def score_jacobian(denoiser: Callable[[Tensor, Tensor], Tensor], x: Tensor, sigma: float) -> Tensor:
    """Jacobian of the score s(x) = (D(x, sigma) - x) / sigma^2 implied by a denoiser, by autograd.

    Args:
        denoiser: D(x [B, d], sigma [B]) -> [B, d].
        x: Points [B, d].
        sigma: Noise level (EDM form).

    Returns:
        [B, d, d]; its spectral norm is the local Lipschitz constant of the (learned) score.
    """

    def s(xi: Tensor) -> Tensor:
        xb = xi[None]
        return ((denoiser(xb, xb.new_full((1,), sigma)) - xb) / sigma**2)[0]

    return torch.stack([torch.func.jacrev(s)(xi) for xi in x])


def spectral_norm_sym(h: Tensor) -> Tensor:
    """max |eigenvalue| of symmetric [B, d, d] (the symmetrised part is used for learned Jacobians)."""
    return torch.linalg.eigvalsh(0.5 * (h + h.transpose(-1, -2))).abs().amax(-1)


def piecewise_quadratic_logp(x: Tensor, k: float, r: float) -> Tensor:
    """Unnormalised log p_0 with d^2/dx^2 log p_0 = +K on |x| < R and -K outside (so |grad^2 log p_0| <= K).

    log p_0 = K x^2 / 2 on |x| <= R, and K R^2 / 2 + K R (|x| - R) - K (|x| - R)^2 / 2 beyond: a C^1 bimodal density
    (modes at +-2R) whose convex stretch has length 2R. At v = 1/K the posterior over the stretch is flat, so
    sup grad^2 log q_v grows like R^2: letting R -> infinity (the paper's blow-up example, our reconstruction) the
    Lipschitz constant is bounded initially but blows up at the finite time t* = ln(1 + 1/K) / 2.
    """
    a = x.abs()
    outer = 0.5 * k * r**2 + k * r * (a - r) - 0.5 * k * (a - r) ** 2
    return torch.where(a <= r, 0.5 * k * x**2, outer)


def logconcave_logp(x: Tensor, m: float) -> Tensor:
    """Smooth strongly log-concave log p_0 = -m x^2 / 2 - log cosh(x): -(m + 1) <= d^2 log p_0 <= -m."""
    return -0.5 * m * x**2 - (
        x.abs() + torch.log1p(torch.exp(-2 * x.abs())) - torch.log(torch.tensor(2.0, dtype=x.dtype))
    )


def logconcave_bounds(m: float, lip: float, t: Tensor | float) -> tuple[Tensor, Tensor]:
    """OU-time band for grad^2 log p_t when -lip <= grad^2 log p_0 <= -m (Brascamp-Lieb / Cramer-Rao):
    [-lip e^{2t} / (1 + lip v), -m e^{2t} / (1 + m v)], v = e^{2t} - 1."""
    t = torch.as_tensor(t, dtype=torch.float64)
    v = ou_to_heat(t)
    return -lip * torch.exp(2 * t) / (1 + lip * v), -m * torch.exp(2 * t) / (1 + m * v)
