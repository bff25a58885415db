"""Readable autograd twins of :mod:`ops.scores.gmm` (parity references, slow)."""

from __future__ import annotations

import torch
from torch import Tensor

from ops.scores.gmm import gmm_log_prob


def _logp_single(x: Tensor, sigma: Tensor, weights: Tensor, means: Tensor, covs: Tensor) -> Tensor:
    """log p_sigma(x) for one point x [d] written directly from the mixture density."""
    d = x.shape[0]
    terms = []
    for w, mu, cov in zip(weights, means, covs):
        c = cov + sigma**2 * torch.eye(d, dtype=x.dtype)
        dist = torch.distributions.MultivariateNormal(mu, covariance_matrix=c)
        terms.append(torch.log(w) + dist.log_prob(x))
    return torch.logsumexp(torch.stack(terms), 0)


def naive_gmm_denoiser(x: Tensor, sigma: float, weights: Tensor, means: Tensor, covs: Tensor) -> Tensor:
    """Tweedie's formula D = x + sigma^2 grad log p_sigma(x), the gradient taken by autograd. x [B, d] -> [B, d]."""
    xr = x.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(gmm_log_prob(xr, sigma, weights, means, covs).sum(), xr)
    return x + sigma**2 * grad


def naive_gmm_hessian(x: Tensor, sigma: float, weights: Tensor, means: Tensor, covs: Tensor) -> Tensor:
    """Hessian of log p_sigma by ``torch.func.hessian`` of the per-point density; x [B, d] -> [B, d, d]."""
    s = torch.as_tensor(sigma, dtype=x.dtype)
    out = [torch.func.hessian(_logp_single)(xi, s, weights, means, covs) for xi in x]
    return torch.stack(out)
