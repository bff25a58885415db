"""Contribution-aware timestep distribution (ADDP insight 1) on a discrete VP schedule.

Training timesteps are ``t in {1..T}`` at continuous VP time ``t / T`` of the suite's linear-beta schedule
(:func:`ops.samplers.vp_alpha_sigma`); the denoiser works in the EDM form ``x~ = x_t / alpha_t`` with noise level
``sigma~_t = sigma_t / alpha_t`` (:func:`vp_sigma_tilde`). DDIM with ``K`` steps visits ``ddim_timesteps(T, K)``.

The paper states that earlier denoising steps contribute more to perception quality and that the training objective
should reflect each timestep's contribution; the functional form was not recovered. **Our interpretation**
(:func:`contribution_curve`): measure the quality ``q_k`` of the x0-prediction at every DDIM step (``q_0``: the
prediction before any step, x0 = 0), take the per-step gain ``g_k = max(+-(q_k - q_{k-1}), 0)``, spread ``g_k``
uniformly over the training timesteps that step ``k`` stands for (those nearest to its timestep), smooth, mix with a
uniform floor and normalise:

    p_t = (1 - floor) * smooth(G)_t / sum(smooth(G)) + floor / T.

Two equivalent ways to use ``p_t`` (importance sampling): draw ``t ~ p_t`` with unit weight, or draw ``t ~ U{1..T}``
with weight ``w(t) = T p_t[t]`` (:func:`loss_weight`): ``E_{t~p}[L_t] = sum_t p_t L_t = E_{t~U}[T p_t L_t]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from core.errors import ConfigError
from ops.samplers import vp_alpha_sigma


def vp_sigma_tilde(t: Tensor, T: int, beta_min: float = 0.1, beta_max: float = 20.0) -> Tensor:
    """sigma~ = sigma_t / alpha_t at continuous time ``t / T`` for integer timesteps ``t [B]`` in 1..T (float64)."""
    alpha, sigma = vp_alpha_sigma(torch.as_tensor(t, dtype=torch.float64) / T, beta_min, beta_max)
    return sigma / alpha


def ddim_timesteps(T: int, K: int) -> Tensor:
    """The ``K`` training timesteps DDIM visits, from T down to 1, evenly spaced (int64 [K], strictly decreasing)."""
    if not 1 <= K <= T:
        raise ConfigError(f"DDIM steps K={K} must be in 1..T={T}")
    ts = torch.linspace(T, 1, K, dtype=torch.float64).round().long()
    if K > 1 and bool((ts[1:] >= ts[:-1]).any()):
        raise ConfigError(f"DDIM steps K={K} collide on T={T} timesteps")
    return ts


def _check_p(p_t: Tensor) -> Tensor:
    if p_t.ndim != 1 or p_t.numel() < 1 or bool((p_t < 0).any()) or not bool(torch.isfinite(p_t).all()):
        raise ConfigError("p_t must be a finite non-negative 1-D distribution over the T timesteps")
    s = float(p_t.sum())
    if abs(s - 1.0) > 1e-6:
        raise ConfigError(f"p_t must sum to 1, sums to {s}")
    return p_t


def contribution_curve(
    quality: Tensor,
    steps: Tensor,
    T: int,
    higher_is_better: bool = True,
    floor: float = 0.1,
    smooth: float = 0.0,
) -> Tensor:
    """Per-step x0 quality -> contribution-aware timestep distribution ``p_t [T]`` (float64; see the module docstring).

    Args:
        quality: ``[K + 1]``: ``q_0`` (before the first step) then the quality after each of the K DDIM steps.
        steps: ``[K]`` the training timestep (1..T) of each DDIM step, decreasing.
        T: Number of training timesteps.
        higher_is_better: IoU-like (True) or error-like (False, e.g. AbsRel) quality.
        floor: Uniform mass mixed in, in [0, 1]: every timestep keeps some training signal.
        smooth: Gaussian smoothing bandwidth in timesteps (0: none).
    """
    q = torch.as_tensor(quality, dtype=torch.float64)
    st = torch.as_tensor(steps, dtype=torch.long)
    if q.ndim != 1 or st.ndim != 1 or q.numel() != st.numel() + 1:
        raise ConfigError(f"quality [K+1] and steps [K] expected, got {tuple(q.shape)} and {tuple(st.shape)}")
    if not 0 <= floor <= 1 or smooth < 0:
        raise ConfigError(f"floor={floor} must be in [0, 1] and smooth={smooth} >= 0")
    if bool((st < 1).any()) or bool((st > T).any()):
        raise ConfigError(f"steps must lie in 1..T={T}, got {st.tolist()}")
    q = torch.nan_to_num(q, nan=0.0)
    gain = (q[1:] - q[:-1]) if higher_is_better else (q[:-1] - q[1:])
    gain = gain.clamp_min(0)
    t = torch.arange(1, T + 1, dtype=torch.float64)
    owner = (t[:, None] - st[None].double()).abs().argmin(dim=1)  # [T]: the DDIM step each timestep stands for
    counts = torch.bincount(owner, minlength=st.numel()).double()
    g = gain[owner] / counts[owner].clamp_min(1)
    if smooth > 0:
        kernel = torch.exp(-0.5 * ((t[:, None] - t[None]) / smooth) ** 2)
        g = kernel @ g / kernel.sum(1)
    if float(g.sum()) <= 0:
        return torch.full((T,), 1.0 / T, dtype=torch.float64)
    return (1 - floor) * g / g.sum() + floor / T


def power_distribution(T: int, gamma: float) -> Tensor:
    """A fixed early-favouring prior ``p_t ~ (t / T)^gamma`` (gamma = 0: uniform); float64 [T]."""
    if gamma < 0:
        raise ConfigError(f"gamma={gamma} must be >= 0")
    p = (torch.arange(1, T + 1, dtype=torch.float64) / T) ** gamma
    return p / p.sum()


def sample_timesteps(p_t: Tensor, n: int, generator: torch.Generator | None = None) -> Tensor:
    """Draw ``n`` timesteps in 1..T with probabilities ``p_t [T]`` (int64 [n])."""
    p = _check_p(torch.as_tensor(p_t, dtype=torch.float64))
    return torch.multinomial(p, n, replacement=True, generator=generator) + 1


def loss_weight(p_t: Tensor, t: Tensor) -> Tensor:
    """The importance weight ``T p_t[t]`` of uniformly drawn timesteps ``t [B]`` (1..T) -> float64 [B]."""
    p = _check_p(torch.as_tensor(p_t, dtype=torch.float64))
    return p.numel() * p[torch.as_tensor(t, dtype=torch.long) - 1]
