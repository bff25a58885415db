"""RX-DPM: Richardson extrapolation of two ODE solutions at the same NFE (Choi, Kang & Han, ICLR 2025).

On each coarse interval [sigma_a, sigma_b] holding k fine steps, the base solver produces a fine solution (k steps)
and a coarse one (one step sigma_a -> sigma_b) that reuses denoiser outputs already computed (the first fine step's
D(x_a, sigma_a) for Euler/DDIM; for DPM-Solver++(2M) also the D stored at the previous coarse node), so the NFE equals
the base solver's. With a base solver of order p the local error of a step of size h is ~ C h^(p+1), hence

    x_fine ~ x* + C a H^(p+1),   x_coarse ~ x* + C H^(p+1),   a = sum_m (h_m / H)^(p+1)          (grid-adapted a)

and eliminating C gives the extrapolation (the paper's linear system A c = e_1 with A = [[1, 1], [1, a]]):

    x* = (x_fine - a x_coarse) / (1 - a),   i.e.  c_fine = 1/(1 - a),  c_coarse = a/(a - 1).

On a uniform sub-grid a = k^(-p) (k = 2, p = 1: the naive (2, -1)). The same two solutions give the explicit error
estimate of the fine solution, err = C a H^(p+1) = a (x_fine - x_coarse) / (a - 1), returned per interval.

Grid remainder (official ``skip_last``): if N mod k != 0 the last N mod k steps are plain base steps; with
``skip_last=False`` the last interval absorbs them. DPM-Solver++(2M) intervals need a previous coarse node, so the
first interval is plain (as the official RX-DDIM's first round), and a final step into sigma = 0 (where 2M is first
order) is plain too.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ops.samplers.grids import check_grid, step_ratio_exponent_sum
from ops.samplers.solvers import (
    SOLVER_ORDER,
    Denoiser,
    SampleOutput,
    call_denoiser,
    dpmpp_2m_step,
    euler_step,
)
from suite.errors import ConfigError

RX_SOLVERS = ("euler", "dpmpp_2m")
COEFFICIENTS = ("adapted", "naive")


def rx_coeffs(fine_grid: Tensor, order: int = 1, coefficients: str = "adapted") -> tuple[float, float]:
    """Extrapolation weights (c_coarse, c_fine) for one coarse interval.

    Args:
        fine_grid: The k+1 sigmas of the interval [k+1], decreasing.
        order: Order p of the base solver (local error exponent p + 1).
        coefficients: ``adapted`` (the paper: a from the actual step sizes) or ``naive`` (uniform-grid a = k^-p).

    Returns:
        (c_coarse, c_fine) with c_coarse + c_fine = 1. A uniform k = 2 Euler interval gives (-1, 2).
    """
    if coefficients not in COEFFICIENTS:
        raise ConfigError(f"coefficients={coefficients!r} must be one of {list(COEFFICIENTS)}")
    k = len(fine_grid) - 1
    if k < 2:
        raise ConfigError(f"an RX interval needs k >= 2 fine steps, got {k}")
    a = step_ratio_exponent_sum(fine_grid, order + 1) if coefficients == "adapted" else float(k) ** (-order)
    return a / (a - 1.0), 1.0 / (1.0 - a)


def rx_plan(n_steps: int, k: int, skip_last: bool, first_plain: bool, last_plain: bool) -> list[tuple[int, int, bool]]:
    """Chunks (start, end, extrapolate) covering steps 0..n_steps of the grid."""
    chunks: list[tuple[int, int, bool]] = []
    lo, hi = 0, n_steps - int(last_plain)
    if first_plain and hi - lo >= k:
        chunks.append((lo, lo + k, False))
        lo += k
    n_full, rem = divmod(hi - lo, k)
    for j in range(n_full):
        chunks.append((lo + j * k, lo + (j + 1) * k, True))
    end = lo + n_full * k
    if rem:
        if skip_last or not n_full:
            chunks.append((end, hi, False))
        else:
            s, _, _ = chunks.pop()
            chunks.append((s, hi, True))
    if last_plain:
        chunks.append((hi, n_steps, False))
    return chunks


def rx_sample(
    denoiser: Denoiser,
    x: Tensor,
    sigmas: Tensor,
    solver: str = "euler",
    k: int = 2,
    coefficients: str = "adapted",
    skip_last: bool = True,
) -> SampleOutput:
    """RX-DPM sampling with base ``solver`` (``euler``/DDIM or ``dpmpp_2m``) at the base solver's NFE.

    Args:
        denoiser: D(x [B, ...], sigma [B]) -> [B, ...].
        x: Start state [B, ...] at sigmas[0].
        sigmas: Decreasing grid [N+1] (any spacing; EDM, VP gamma grid, ...).
        solver: Base solver.
        k: Fine steps per coarse interval (k = 1 is the plain base solver).
        coefficients: ``adapted`` (paper) or ``naive`` (uniform (2, -1) for k = 2, Euler).
        skip_last: Leave a remainder of N mod k steps un-extrapolated (else the last interval absorbs it).

    Returns:
        :class:`SampleOutput` with ``error_estimates`` [n_intervals, B] (norm of a (x_fine - x_coarse)/(a - 1)).
    """
    if solver not in RX_SOLVERS:
        raise ConfigError(f"rx solver={solver!r} must be one of {list(RX_SOLVERS)} (no extra-NFE-free coarse step)")
    if coefficients not in COEFFICIENTS:
        raise ConfigError(f"coefficients={coefficients!r} must be one of {list(COEFFICIENTS)}")
    if k < 1:
        raise ConfigError(f"rx k={k} must be >= 1")
    multistep = solver == "dpmpp_2m"
    sig_t = check_grid(sigmas, min_steps=k * (2 if multistep else 1), name="sigmas")
    sig = sig_t.tolist()
    n = len(sig) - 1
    order = SOLVER_ORDER[solver]
    if k == 1:
        plan = [(0, n, False)]
    else:
        plan = rx_plan(n, k, skip_last, first_plain=multistep, last_plain=multistep and sig[-1] == 0.0)
    nfe = 0
    estimates: list[Tensor] = []
    d_prev = s_prev = None  # fine-trajectory history (2M)
    c_prev = cs_prev = None  # previous coarse node's D and sigma (2M)

    def step(x: Tensor, d: Tensor, s: float, t: float, hist: Tensor | None, s_hist: float | None) -> Tensor:
        return dpmpp_2m_step(x, d, s, t, hist, s_hist) if multistep else euler_step(x, d, s, t)

    for a, b, extrapolate in plan:
        x_a = x
        d_a = call_denoiser(denoiser, x_a, sig[a])
        nfe += 1
        x = step(x_a, d_a, sig[a], sig[a + 1], d_prev, s_prev)
        d_prev, s_prev = d_a, sig[a]
        for j in range(a + 1, b):
            d = call_denoiser(denoiser, x, sig[j])
            nfe += 1
            x = step(x, d, sig[j], sig[j + 1], d_prev, s_prev)
            d_prev, s_prev = d, sig[j]
        if extrapolate:
            x_coarse = step(x_a, d_a, sig[a], sig[b], c_prev, cs_prev)
            c_coarse, c_fine = rx_coeffs(sig_t[a : b + 1], order, coefficients)
            a_w = c_coarse / (c_coarse - 1.0)  # recover a from c_coarse = a / (a - 1)
            err = a_w * (x - x_coarse) / (a_w - 1.0)
            estimates.append(err.flatten(1).norm(dim=1))
            x = c_fine * x + c_coarse * x_coarse
        c_prev, cs_prev = d_a, sig[a]
    est = torch.stack(estimates) if estimates else None
    return SampleOutput(x, nfe, est)
