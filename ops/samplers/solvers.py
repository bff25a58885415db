"""Probability-flow ODE solvers in the EDM form ``dx/dsigma = (x - D(x, sigma)) / sigma`` on arbitrary grids.

``denoiser(x, sigma)`` takes x [B, ...] and sigma [B] and returns the data prediction D [B, ...]. VP models enter
through the change of variables of :mod:`ops.samplers.grids` (the solvers below are invariant under it: DDIM is
exactly Euler in (x / alpha, sigma / alpha), and DPM-Solver's exponential integrators become the formulas below).

* ``euler`` / DDIM (Song et al. 2021a): x_t = (t/s) x_s + (1 - t/s) D_s, order 1, 1 NFE per step.
* ``heun``: EDM Alg. 1 (Karras et al. 2022): trapezoid corrector, order 2, 2 NFE per step (1 on a step to sigma=0).
* ``dpm2``: DPM-Solver-2 (Lu et al. 2022, Alg. 1, r1 = 1/2): noise prediction, midpoint in lambda = -log sigma,
  order 2, 2 NFE per step (Euler on a step to sigma=0).
* ``dpmpp_2m``: DPM-Solver++(2M) (Lu et al. 2022b, Alg. 2): data prediction, multistep, order 2, 1 NFE per step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from core.errors import ConfigError
from ops.samplers.grids import check_grid

Denoiser = Callable[[Tensor, Tensor], Tensor]

#: Order p of each base solver (global error O(h^p)).
SOLVER_ORDER = {"euler": 1, "heun": 2, "dpm2": 2, "dpmpp_2m": 2}


@dataclass
class SampleOutput:
    """Result of a sampler run.

    Attributes:
        x: Final state [B, ...] at the last grid sigma.
        nfe: Number of denoiser evaluations used.
        error_estimates: RX only: [n_extrapolated_intervals, B] Richardson estimate of the fine solution's local
            error norm on each extrapolated interval (see :func:`ops.samplers.rx.rx_sample`); ``None`` otherwise.
    """

    x: Tensor
    nfe: int
    error_estimates: Tensor | None = None


def call_denoiser(denoiser: Denoiser, x: Tensor, sigma: float) -> Tensor:
    """D(x, sigma) with sigma broadcast to [B] in the dtype of x."""
    return denoiser(x, x.new_full((x.shape[0],), float(sigma)))


def euler_step(x: Tensor, d: Tensor, s: float, t: float) -> Tensor:
    """One Euler/DDIM step s -> t given D(x, s): x + (t - s)(x - D)/s = (t/s) x + (1 - t/s) D (Eq. (4) of DDIM)."""
    ratio = t / s
    return ratio * x + (1.0 - ratio) * d


def dpmpp_2m_step(x: Tensor, d: Tensor, s: float, t: float, d_prev: Tensor | None, s_prev: float | None) -> Tensor:
    """One DPM-Solver++(2M) step s -> t (Lu et al. 2022b, Alg. 2), first order without history or when t = 0.

    With h = lambda_t - lambda_s = log(s/t) and r = h_prev / h: D' = (1 + 1/(2r)) D_s - 1/(2r) D_prev and
    x_t = (t/s) x_s + (1 - e^{-h}) D'.
    """
    if t == 0.0 or d_prev is None:
        return euler_step(x, d, s, t)
    h = math.log(s / t)
    r = math.log(s_prev / s) / h
    d_eff = (1.0 + 0.5 / r) * d - (0.5 / r) * d_prev
    return euler_step(x, d_eff, s, t)


def euler_sampler(denoiser: Denoiser, x: Tensor, sigmas: Tensor) -> SampleOutput:
    """Euler (= DDIM) on the grid ``sigmas`` [N+1]; NFE = N."""
    sig = check_grid(sigmas).tolist()
    for s, t in zip(sig[:-1], sig[1:]):
        x = euler_step(x, call_denoiser(denoiser, x, s), s, t)
    return SampleOutput(x, len(sig) - 1)


def heun_step(denoiser: Denoiser, x: Tensor, s: float, t: float, d_s: Tensor | None = None) -> tuple[Tensor, int]:
    """One EDM Heun step s -> t (Karras et al. 2022, Alg. 1, lines 4-8); Euler when t = 0.

    ``d_s`` reuses an already computed D(x, s). Returns (x_t, NFE spent here).
    """
    nfe = 0
    if d_s is None:
        d_s, nfe = call_denoiser(denoiser, x, s), 1
    d1 = (x - d_s) / s
    x_e = x + (t - s) * d1
    if t == 0.0:
        return x_e, nfe
    d2 = (x_e - call_denoiser(denoiser, x_e, t)) / t
    return x + (t - s) * 0.5 * (d1 + d2), nfe + 1


def dpm2_step(denoiser: Denoiser, x: Tensor, s: float, t: float, d_s: Tensor | None = None) -> tuple[Tensor, int]:
    """One DPM-Solver-2 step s -> t (Lu et al. 2022, Alg. 1, r1 = 1/2) in the scaled variables; DDIM when t = 0.

    eps = (x - D)/sigma; s1 = sqrt(s t) (lambda midpoint); u = x + (s1 - s) eps_s; x_t = x + (t - s) eps(u, s1).
    ``d_s`` reuses an already computed D(x, s). Returns (x_t, NFE spent here).
    """
    nfe = 0
    if d_s is None:
        d_s, nfe = call_denoiser(denoiser, x, s), 1
    if t == 0.0:
        return euler_step(x, d_s, s, t), nfe
    s1 = math.sqrt(s * t)
    u = x + (s1 - s) * (x - d_s) / s
    eps1 = (u - call_denoiser(denoiser, u, s1)) / s1
    return x + (t - s) * eps1, nfe + 1


def heun_sampler(denoiser: Denoiser, x: Tensor, sigmas: Tensor) -> SampleOutput:
    """EDM Heun (Karras et al. 2022, Alg. 1 with S_churn = 0); NFE = 2N, or 2N - 1 if the grid ends at 0."""
    sig = check_grid(sigmas).tolist()
    nfe = 0
    for s, t in zip(sig[:-1], sig[1:]):
        x, n = heun_step(denoiser, x, s, t)
        nfe += n
    return SampleOutput(x, nfe)


def dpm2_sampler(denoiser: Denoiser, x: Tensor, sigmas: Tensor) -> SampleOutput:
    """Singlestep DPM-Solver-2 (Lu et al. 2022, Alg. 1 / Eq. (3.8), r1 = 1/2) in the scaled variables (see
    :func:`dpm2_step`). A step to sigma = 0 (lambda = inf) is a DDIM step. NFE = 2N (2N - 1 if the grid ends at 0).
    """
    sig = check_grid(sigmas).tolist()
    nfe = 0
    for s, t in zip(sig[:-1], sig[1:]):
        x, n = dpm2_step(denoiser, x, s, t)
        nfe += n
    return SampleOutput(x, nfe)


def dpmpp_2m_sampler(denoiser: Denoiser, x: Tensor, sigmas: Tensor) -> SampleOutput:
    """Multistep DPM-Solver++(2M) (Lu et al. 2022b, Alg. 2); the first step is first order. NFE = N."""
    sig = check_grid(sigmas).tolist()
    d_prev, s_prev = None, None
    for s, t in zip(sig[:-1], sig[1:]):
        d = call_denoiser(denoiser, x, s)
        x = dpmpp_2m_step(x, d, s, t, d_prev, s_prev)
        d_prev, s_prev = d, s
    return SampleOutput(x, len(sig) - 1)


SAMPLERS: dict[str, Callable[[Denoiser, Tensor, Tensor], SampleOutput]] = {
    "euler": euler_sampler,
    "heun": heun_sampler,
    "dpm2": dpm2_sampler,
    "dpmpp_2m": dpmpp_2m_sampler,
}


def nfe_of(solver: str, n_steps: int, ends_at_zero: bool) -> int:
    """NFE a base solver spends on a grid of ``n_steps`` steps."""
    if solver not in SOLVER_ORDER:
        raise ConfigError(f"solver={solver!r} must be one of {sorted(SOLVER_ORDER)}")
    if solver in ("heun", "dpm2"):
        return 2 * n_steps - int(ends_at_zero)
    return n_steps


def steps_for_nfe(solver: str, nfe: int, ends_at_zero: bool = True) -> int:
    """Largest number of grid steps whose NFE does not exceed ``nfe``.

    Raises:
        ConfigError: ``nfe`` is smaller than the solver's order (no step of that order fits in the budget).
    """
    if solver not in SOLVER_ORDER:
        raise ConfigError(f"solver={solver!r} must be one of {sorted(SOLVER_ORDER)}")
    if nfe < SOLVER_ORDER[solver]:
        raise ConfigError(f"nfe={nfe} is smaller than the order {SOLVER_ORDER[solver]} of solver={solver!r}")
    if solver in ("heun", "dpm2"):
        return (nfe + int(ends_at_zero)) // 2
    return nfe


def sample(denoiser: Denoiser, x: Tensor, sigmas: Tensor, solver: str = "euler") -> SampleOutput:
    """Run base ``solver`` from x [B, ...] at sigmas[0] to sigmas[-1]."""
    if solver not in SAMPLERS:
        raise ConfigError(f"solver={solver!r} must be one of {sorted(SAMPLERS)}")
    return SAMPLERS[solver](denoiser, x, sigmas)


def recording(denoiser: Denoiser) -> tuple[Denoiser, list[tuple[float, Tensor]]]:
    """Wrap ``denoiser`` so that every call's (sigma, D(x, sigma)) is appended to the returned list: the
    x0-prediction of each denoising step (one per step for Euler/DDIM and DPM-Solver++(2M)), for per-step quality
    curves (:mod:`callbacks.x0_quality`)."""
    calls: list[tuple[float, Tensor]] = []

    def wrapped(x: Tensor, sigma: Tensor) -> Tensor:
        d = denoiser(x, sigma)
        calls.append((float(sigma.reshape(-1)[0]), d.detach()))
        return d

    return wrapped, calls
