"""Deep SEMDICE pieces: the soft-chi^2 f-divergence closed forms and the particle-based kNN entropy estimate.

Soft chi^2 (the official deep code, inherited from OptiDICE)::

    f(x)          = x log x - x + 1   (x < 1),     (x - 1)^2 / 2   (x >= 1)
    (f')^{-1}(y)  = exp(y)            (y < 0),     y + 1           (y >= 0)
    f*_+(y)       = exp(y) - 1        (y < 0),     y^2 / 2 + y     (y >= 0)

``f*_+(y) = max_{x >= 0} x y - f(x)`` is attained at ``x = (f')^{-1}(y)``; all three are C^1 at the joins.

Particle-based entropy (APT / URLB ``PBE``): with ``r_k(s)`` the mean distance from ``s`` to its ``k`` nearest
neighbours in the batch, ``PBE(s) = log(c + r_k(s))`` and, from the kNN density estimate ``p(s) ∝ r_k(s)^{-D}``,
``log p_D(s) ≈ -D * PBE(s)`` up to a constant, which the batch logsumexp of the dual absorbs.
"""

from __future__ import annotations

import torch


def soft_chisq_f(x: torch.Tensor) -> torch.Tensor:
    """Soft-chi^2 generator ``f(x)`` (module docstring), ``x >= 0``."""
    xs = x.clamp_min(1e-300)
    return torch.where(x < 1, torch.special.xlogy(x, xs) - x + 1, 0.5 * (x - 1) ** 2)


def soft_chisq_f_prime_inv(y: torch.Tensor) -> torch.Tensor:
    """``(f')^{-1}(y)``: the optimal density ratio ``w = d / d_D`` for a dual residual ``y = e / alpha``."""
    return torch.where(y < 0, torch.exp(y.clamp_max(0)), y + 1)


def soft_chisq_f_pos_conj(y: torch.Tensor) -> torch.Tensor:
    """``f*_+(y) = max_{x >= 0} x y - f(x)``."""
    return torch.where(y < 0, torch.exp(y.clamp_max(0)) - 1, 0.5 * y**2 + y)


def knn_mean_distance(x: torch.Tensor, k: int = 6) -> torch.Tensor:
    """Mean Euclidean distance from each row of ``x [B, D]`` to its ``k`` nearest other rows, ``[B]``."""
    return knn_distances(x, k).mean(1)


def knn_mean_distance_naive(x: torch.Tensor, k: int = 6) -> torch.Tensor:
    """Loop twin of :func:`knn_mean_distance` (sorts each row's distances to every other row)."""
    out = []
    for i in range(x.shape[0]):
        d = torch.stack([torch.sqrt(((x[i] - x[j]) ** 2).sum()) for j in range(x.shape[0]) if j != i])
        out.append(torch.sort(d).values[:k].mean())
    return torch.stack(out)


def knn_distances(x: torch.Tensor, k: int) -> torch.Tensor:
    """Distances from each row of ``x [B, D]`` to its ``k`` nearest other rows, ascending, ``[B, k]``."""
    if not 1 <= k < x.shape[0]:
        raise ValueError(f"k={k} must satisfy 1 <= k < batch size {x.shape[0]}")
    dist = torch.cdist(x, x)
    dist = dist + torch.diag(torch.full((x.shape[0],), float("inf"), dtype=x.dtype, device=x.device))
    return dist.topk(k, dim=1, largest=False).values


class RunningMean:
    """Running mean of every value seen (URLB's ``RMS`` mean, started at 0 with a 1e-4 pseudo-count): APT divides
    its kNN distances by it so the particle reward keeps one scale while the agent's states spread."""

    def __init__(self, eps: float = 1e-4) -> None:
        self.mean, self.count = 0.0, eps

    def update(self, x: torch.Tensor) -> float:
        n = x.numel()
        self.mean += (float(x.mean()) - self.mean) * n / (self.count + n)
        self.count += n
        return self.mean


def apt_particle_reward(x: torch.Tensor, k: int = 12, c: float = 1.0, rms: RunningMean | None = None) -> torch.Tensor:
    """APT's intrinsic reward of a batch of states ``x [B, D]`` (Liu & Abbeel 2021, the particle-based entropy
    reward; URLB ``PBE`` with ``knn_avg``): ``log(c + mean_j d_j(s) / m)``, ``d_j`` the distances to the ``k``
    nearest other states of the batch, ``m`` the running mean of all distances seen (``rms``; ``None``: ``m = 1``,
    the raw distances), ``[B]``."""
    d = knn_distances(x, k)
    if rms is not None:
        d = d / rms.update(d)
    return torch.log(c + d.mean(1))


def pbe_log_density(x: torch.Tensor, k: int = 6, c: float = 1.0) -> torch.Tensor:
    """``log p_D(s) ≈ -D * log(c + r_k(s))`` for a batch of states ``x [B, D]`` (k = 6 in the paper), ``[B]``."""
    return -x.shape[1] * torch.log(c + knn_mean_distance(x, k))


def log_soft_chisq_f_prime_inv(y: torch.Tensor) -> torch.Tensor:
    """``log (f')^{-1}(y)`` = ``y`` (y < 0), ``log(1 + y)`` (y >= 0): the deep actor's objective."""
    return torch.where(y < 0, y, torch.log1p(y.clamp_min(0)))


def semdice_deep_dual(
    nu_s: torch.Tensor,
    nu_next: torch.Tensor,
    mu_s: torch.Tensor,
    log_p: torch.Tensor,
    not_done: torch.Tensor,
    gamma: float,
    alpha: float,
) -> torch.Tensor:
    """Sample estimate of the SEMDICE dual on a batch of transitions ``(s, a, s')`` (all ``[B]``):

    ``E_D[nu(s) - gamma nu(s')] + alpha E_D[f*_+(e / alpha)] + log mean_B exp(-mu(s) - log p_D(s))`` with
    ``e = mu(s) + gamma nu(s') - nu(s)`` (``nu(s')`` masked at terminal transitions). The first term replaces
    ``(1 - gamma) E_{p0}[nu]`` by its dataset estimate; the last is the importance-weighted estimate of
    ``log sum_s exp(-mu(s))`` (the entropy conjugate) under ``p_D``.
    """
    nu_next = not_done * nu_next
    e = mu_s + gamma * nu_next - nu_s
    lse = torch.logsumexp(-mu_s - log_p, dim=0) - torch.log(torch.tensor(float(mu_s.shape[0]), dtype=mu_s.dtype))
    return (nu_s - gamma * nu_next).mean() + alpha * soft_chisq_f_pos_conj(e / alpha).mean() + lse
