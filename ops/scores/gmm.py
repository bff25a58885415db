"""Closed-form quantities of a Gaussian mixture convolved with isotropic Gaussian noise.

The data law is ``p_0 = sum_k w_k N(mu_k, Sigma_k)``. In the EDM (variance-exploding) form ``x = x_0 + sigma z``,
the noisy law is ``p_sigma = sum_k w_k N(mu_k, Sigma_k + sigma^2 I)``, so its log-density, score (Tweedie:
``grad log p_sigma(x) = (D(x, sigma) - x) / sigma^2``), denoiser ``D = E[x_0 | x]`` and Hessian are exact. Any VP
sampler reduces to this form with ``x~ = x_t / alpha_t`` and ``sigma~ = sigma_t / alpha_t`` (see ``ops.samplers``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from core.errors import ConfigError


def check_gmm(weights: Tensor, means: Tensor, covs: Tensor) -> None:
    """Validate mixture parameters: weights [K] > 0 summing to 1, means [K, d], covs [K, d, d] symmetric PD."""
    if weights.ndim != 1 or means.ndim != 2 or covs.ndim != 3:
        raise ConfigError(
            f"gmm shapes weights{tuple(weights.shape)} means{tuple(means.shape)} covs{tuple(covs.shape)} "
            "must be [K], [K, d], [K, d, d]"
        )
    k, d = means.shape
    if weights.shape[0] != k or covs.shape != (k, d, d):
        raise ConfigError(f"gmm with K={k}, d={d} needs weights [K] and covs [K, d, d], got {tuple(covs.shape)}")
    if bool((weights <= 0).any()) or not math.isclose(float(weights.sum()), 1.0, rel_tol=1e-6):
        raise ConfigError(f"gmm weights={weights.tolist()} must be > 0 and sum to 1")
    if not torch.allclose(covs, covs.transpose(-1, -2)) or bool((torch.linalg.eigvalsh(covs) <= 0).any()):
        raise ConfigError("gmm covs must be symmetric positive definite")


def _sigma_batch(sigma: Tensor | float, x: Tensor) -> Tensor:
    """Broadcast ``sigma`` (scalar or [B]) to [B] in the dtype of ``x``; negative sigma is an error."""
    s = torch.as_tensor(sigma, dtype=x.dtype, device=x.device)
    s = s.expand(x.shape[0]) if s.ndim == 0 else s.reshape(-1)
    if s.shape[0] != x.shape[0]:
        raise ConfigError(f"sigma has {s.shape[0]} entries for a batch of {x.shape[0]}")
    if bool((s < 0).any()):
        raise ConfigError(f"sigma={s.min().item()} must be >= 0")
    return s


def _components(x: Tensor, sigma: Tensor | float, weights: Tensor, means: Tensor, covs: Tensor):
    """Per-component pieces for x [B, d]: responsibilities r [B, K], precisions P [B, K, d, d], diff [B, K, d]
    and log p_sigma(x) [B]."""
    s = _sigma_batch(sigma, x)
    d = x.shape[1]
    eye = torch.eye(d, dtype=x.dtype, device=x.device)
    cov = covs.to(x) + (s**2)[:, None, None, None] * eye  # [B, K, d, d]
    chol = torch.linalg.cholesky(cov)
    diff = x[:, None, :] - means.to(x)[None]  # [B, K, d]
    sol = torch.cholesky_solve(diff.unsqueeze(-1), chol).squeeze(-1)  # P (x - mu), [B, K, d]
    maha = (diff * sol).sum(-1)
    logdet = 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
    logn = -0.5 * (maha + logdet + d * math.log(2 * math.pi))
    logw = torch.log(weights.to(x))[None] + logn  # [B, K]
    logp = torch.logsumexp(logw, dim=1)
    r = torch.softmax(logw, dim=1)
    return r, chol, diff, sol, logp, s


def gmm_log_prob(x: Tensor, sigma: Tensor | float, weights: Tensor, means: Tensor, covs: Tensor) -> Tensor:
    """log p_sigma(x) for x [B, d], sigma scalar or [B]; returns [B]."""
    return _components(x, sigma, weights, means, covs)[4]


def gmm_denoiser(x: Tensor, sigma: Tensor | float, weights: Tensor, means: Tensor, covs: Tensor) -> Tensor:
    """Exact posterior mean D(x, sigma) = E[x_0 | x_0 + sigma z = x] (the optimal EDM denoiser).

    Per component, E[x_0 | x, k] = mu_k + Sigma_k (Sigma_k + sigma^2 I)^{-1} (x - mu_k); D mixes them with the
    posterior responsibilities. Equivalently D = x + sigma^2 grad log p_sigma(x) (Tweedie). Shapes: x [B, d] -> [B, d].
    """
    r, _, _, sol, _, _ = _components(x, sigma, weights, means, covs)
    comp = means.to(x)[None] + torch.einsum("kde,bke->bkd", covs.to(x), sol)
    return (r.unsqueeze(-1) * comp).sum(1)


def gmm_score(x: Tensor, sigma: Tensor | float, weights: Tensor, means: Tensor, covs: Tensor) -> Tensor:
    """grad_x log p_sigma(x) = -sum_k r_k P_k (x - mu_k); x [B, d] -> [B, d]."""
    r, _, _, sol, _, _ = _components(x, sigma, weights, means, covs)
    return -(r.unsqueeze(-1) * sol).sum(1)


def gmm_hessian(x: Tensor, sigma: Tensor | float, weights: Tensor, means: Tensor, covs: Tensor) -> Tensor:
    """Hessian of log p_sigma at x: sum_k r_k (g_k g_k^T - P_k) - g g^T with g_k = -P_k (x - mu_k), g = sum r_k g_k.

    Returns [B, d, d]. Its spectral norm is the local Lipschitz constant of the score (sgm_lipschitz).
    """
    r, chol, _, sol, _, _ = _components(x, sigma, weights, means, covs)
    d = x.shape[1]
    eye = torch.eye(d, dtype=x.dtype, device=x.device).expand(*chol.shape[:2], d, d)
    prec = torch.cholesky_solve(eye, chol)  # [B, K, d, d]
    g_k = -sol
    g = (r.unsqueeze(-1) * g_k).sum(1)
    outer = g_k.unsqueeze(-1) * g_k.unsqueeze(-2) - prec
    return (r[..., None, None] * outer).sum(1) - g.unsqueeze(-1) * g.unsqueeze(-2)


def gmm_sample(
    n: int, weights: Tensor, means: Tensor, covs: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    """n exact draws from p_0, returns [n, d] in the dtype of ``means``."""
    idx = torch.multinomial(weights.double(), n, replacement=True, generator=generator)
    chol = torch.linalg.cholesky(covs.double())
    z = torch.randn(n, means.shape[1], generator=generator, dtype=torch.float64)
    x = means.double()[idx] + torch.einsum("nde,ne->nd", chol[idx], z)
    return x.to(means.dtype)
