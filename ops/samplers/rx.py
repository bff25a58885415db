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

Second-order single-step solvers (Heun, DPM-Solver-2; p = 2, k = 2) [our derivation; the official code has neither].
Their coarse step sigma_a -> sigma_b needs one denoiser call at a stage the fine steps never visit (Heun: at the
Euler predictor x_a + H f_a at sigma_b; DPM-Solver-2: at the DDIM predictor at sqrt(sigma_a sigma_b)). With
f = (x - D)/sigma, phi(sigma) = f(x*(sigma), sigma) on the exact path and, at an Euler-type stage z = x_a + l f_a off
it, f(z, sigma) = phi(sigma) - (1/2) J x'' l^2 + O(H^3). The four fine calls determine (x'', x''', J x'') well enough
to rebuild the missing stage to O(H^3) without a call (:func:`heun_interval`, :func:`dpm2_coarse_weights`), so the
coarse solution equals the true base-solver step up to O(H^4), below its O(H^3) local error: the grid-adapted
extrapolation with exponent p + 1 = 3 then lifts the order from 2 to 3 at the same NFE, and the error estimate
a (x_fine - x_coarse)/(a - 1) holds as for Euler.

Grid remainder (official ``skip_last``): if N mod k != 0 the last N mod k steps are plain base steps; with
``skip_last=False`` the last interval absorbs them, k + r fine steps against one coarse step. Its weight a then sums
(h_m / H)^(p+1) over all k + r fine steps (``remainder_weights="consistent"``, the default: the error model above
applied to the interval as it is). The official ``get_coeff`` sums only the first ``frequency`` = k of them while H
spans all k + r (``remainder_weights="official"``), which under-weights the fine solution's error; kept as a flag
for parity with the official EDM sampler. DPM-Solver++(2M) intervals need a previous coarse node, so the
first interval is plain (as the official RX-DDIM's first round), and a final step into sigma = 0 (where 2M is first
order) is plain too, as is a Heun / DPM-Solver-2 step into sigma = 0 (Euler there).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from core.errors import ConfigError
from ops.samplers.grids import check_grid, step_ratio_exponent_sum
from ops.samplers.solvers import (
    SOLVER_ORDER,
    Denoiser,
    SampleOutput,
    call_denoiser,
    dpm2_step,
    dpmpp_2m_step,
    euler_step,
    heun_step,
)

RX_SOLVERS = ("euler", "heun", "dpm2", "dpmpp_2m")
SINGLESTEP_2ND = ("heun", "dpm2")
COEFFICIENTS = ("adapted", "naive")
REMAINDER_WEIGHTS = ("consistent", "official")


def rx_coeffs(
    fine_grid: Tensor, order: int = 1, coefficients: str = "adapted", n_weighted: int | None = None
) -> tuple[float, float]:
    """Extrapolation weights (c_coarse, c_fine) for one coarse interval.

    Args:
        fine_grid: The k+1 sigmas of the interval [k+1], decreasing.
        order: Order p of the base solver (local error exponent p + 1).
        coefficients: ``adapted`` (the paper: a from the actual step sizes) or ``naive`` (uniform-grid a = k^-p).
        n_weighted: Sum a = sum_m (h_m / H)^(p+1) over the first ``n_weighted`` fine steps only, H still the whole
            interval (the official ``get_coeff`` on a remainder-absorbing interval: ``n_weighted = frequency``).
            None sums all k steps (consistent with the error model).

    Returns:
        (c_coarse, c_fine) with c_coarse + c_fine = 1. A uniform k = 2 Euler interval gives (-1, 2).
    """
    if coefficients not in COEFFICIENTS:
        raise ConfigError(f"coefficients={coefficients!r} must be one of {list(COEFFICIENTS)}")
    k = len(fine_grid) - 1
    if k < 2:
        raise ConfigError(f"an RX interval needs k >= 2 fine steps, got {k}")
    if n_weighted is not None and not 1 <= n_weighted <= k:
        raise ConfigError(f"n_weighted={n_weighted} must lie in [1, {k}] (the interval's fine steps)")
    if coefficients == "naive":
        a = float(k) ** (-order)
    elif n_weighted is None:
        a = step_ratio_exponent_sum(fine_grid, order + 1)
    else:
        g = torch.as_tensor(fine_grid, dtype=torch.float64)
        a = float((((g[:-1] - g[1:]) / (g[0] - g[-1]))[:n_weighted] ** (order + 1)).sum())
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


def _f(denoiser: Denoiser, x: Tensor, s: float) -> Tensor:
    """PF-ODE derivative dx/dsigma = (x - D(x, sigma)) / sigma (Karras et al. 2022, Eq. (4))."""
    return (x - call_denoiser(denoiser, x, s)) / s


def heun_interval(denoiser: Denoiser, x: Tensor, sa: float, s1: float, sb: float) -> tuple[Tensor, Tensor]:
    """Two EDM Heun steps sa -> s1 -> sb (fine) and one coarse Heun step sa -> sb, 4 NFE in all (sb > 0).

    Coarse: x_a + H/2 (f_a + f(x_a + H f_a, sb)). Its stage f(x_a + H f_a, sb) is not computed: with the fine
    predictor x~_b = x_1 + h_2 f_1 the two stage points differ by v = -(1/2) x'' (H^2 - h_2^2) + O(H^3), and the
    fine step at s1 evaluates f at x~_1 = x_a + h_1 f_a and at x_1, with x_1 - x~_1 = (1/2) x'' h_1^2 + O(H^3), so
    J v = c (f_1 - f(x~_1)) + O(H^3) with c = -(H^2 - h_2^2) / h_1^2 = -(h_1 + 2 h_2) / h_1 (signed steps h).

    Returns:
        (x_fine, x_coarse) at sb.
    """
    h1, h2 = s1 - sa, sb - s1
    fa = _f(denoiser, x, sa)
    g1 = _f(denoiser, x + h1 * fa, s1)
    x1 = x + 0.5 * h1 * (fa + g1)
    f1 = _f(denoiser, x1, s1)
    g2 = _f(denoiser, x1 + h2 * f1, sb)
    x_fine = x1 + 0.5 * h2 * (f1 + g2)
    c = -(h1 + 2.0 * h2) / h1
    x_coarse = x + 0.5 * (h1 + h2) * (fa + g2 + c * (f1 - g1))
    return x_fine, x_coarse


def dpm2_coarse_weights(sa: float, s1: float, sb: float) -> tuple[float, float, float]:
    """Weights (w_q1, w_f1, w_q2): f(u_c, m_c) = f_a + sum w (stage - f_a) + O(H^3) for DPM-Solver-2's coarse stage.

    Model (delta = sigma - sa): phi = f_a + e1 delta + e2 delta^2 on the exact path, and an Euler-type stage of length
    l from the path is lower by g l^2 (g = J x'' / 2). The fine calls give q1 (at m1 = sqrt(sa s1), l = m1 - sa),
    f_1 (on the path at s1) and q2 (at m2 = sqrt(s1 sb), l = m2 - s1); the target is m_c = sqrt(sa sb), l = m_c - sa.
    """
    m1, m2, mc = math.sqrt(sa * s1), math.sqrt(s1 * sb), math.sqrt(sa * sb)
    d1, e1, e2, ep, ec = s1 - sa, m1 - sa, m2 - sa, m2 - s1, mc - sa
    rows = torch.tensor([[e1, e1**2, -(e1**2)], [d1, d1**2, 0.0], [e2, e2**2, -(ep**2)]], dtype=torch.float64)
    target = torch.tensor([ec, ec**2, -(ec**2)], dtype=torch.float64)
    w = torch.linalg.solve(rows.T, target)
    return float(w[0]), float(w[1]), float(w[2])


def dpm2_interval(denoiser: Denoiser, x: Tensor, sa: float, s1: float, sb: float) -> tuple[Tensor, Tensor]:
    """Two DPM-Solver-2 steps sa -> s1 -> sb (fine) and one coarse step sa -> sb, 4 NFE in all (sb > 0).

    The coarse stage f(x_a + (m_c - sa) f_a, m_c), m_c = sqrt(sa sb), is reconstructed from the fine calls with
    :func:`dpm2_coarse_weights`. Returns (x_fine, x_coarse) at sb.
    """
    m1, m2 = math.sqrt(sa * s1), math.sqrt(s1 * sb)
    fa = _f(denoiser, x, sa)
    q1 = _f(denoiser, x + (m1 - sa) * fa, m1)
    x1 = x + (s1 - sa) * q1
    f1 = _f(denoiser, x1, s1)
    q2 = _f(denoiser, x1 + (m2 - s1) * f1, m2)
    x_fine = x1 + (sb - s1) * q2
    w1, w2, w3 = dpm2_coarse_weights(sa, s1, sb)
    qc = fa + w1 * (q1 - fa) + w2 * (f1 - fa) + w3 * (q2 - fa)
    return x_fine, x + (sb - sa) * qc


def _extrapolate(
    x_fine: Tensor, x_coarse: Tensor, fine_grid: Tensor, order: int, coefficients: str, n_weighted: int | None = None
):
    """(extrapolated x, per-sample norm of the fine solution's error estimate a (x_fine - x_coarse) / (a - 1))."""
    c_coarse, c_fine = rx_coeffs(fine_grid, order, coefficients, n_weighted)
    a = c_coarse / (c_coarse - 1.0)  # recover a from c_coarse = a / (a - 1)
    err = a * (x_fine - x_coarse) / (a - 1.0)
    return c_fine * x_fine + c_coarse * x_coarse, err.flatten(1).norm(dim=1)


def rx_sample(
    denoiser: Denoiser,
    x: Tensor,
    sigmas: Tensor,
    solver: str = "euler",
    k: int = 2,
    coefficients: str = "adapted",
    skip_last: bool = True,
    remainder_weights: str = "consistent",
) -> SampleOutput:
    """RX-DPM sampling with base ``solver`` at the base solver's NFE.

    Args:
        denoiser: D(x [B, ...], sigma [B]) -> [B, ...].
        x: Start state [B, ...] at sigmas[0].
        sigmas: Decreasing grid [N+1] (any spacing; EDM, VP gamma grid, ...).
        solver: Base solver: ``euler`` (= DDIM), ``heun``, ``dpm2`` (k = 2 only) or ``dpmpp_2m``.
        k: Fine steps per coarse interval (k = 1 is the plain base solver).
        coefficients: ``adapted`` (paper) or ``naive`` (uniform-grid a = k^-p: (2, -1) for Euler, (4/3, -1/3) for
            p = 2).
        skip_last: Leave a remainder of N mod k steps un-extrapolated (else the last interval absorbs it; always
            true for Heun / DPM-Solver-2, whose coarse stage is rebuilt for k = 2 only).
        remainder_weights: Weight a of an interval that absorbed the remainder (``skip_last=False``): ``consistent``
            sums (h_m / H)^(p+1) over all its fine steps; ``official`` over the first k only (official ``get_coeff``).

    Returns:
        :class:`SampleOutput` with ``error_estimates`` [n_intervals, B] (norm of a (x_fine - x_coarse)/(a - 1)).
    """
    if solver not in RX_SOLVERS:
        raise ConfigError(f"rx solver={solver!r} must be one of {list(RX_SOLVERS)}")
    if coefficients not in COEFFICIENTS:
        raise ConfigError(f"coefficients={coefficients!r} must be one of {list(COEFFICIENTS)}")
    if remainder_weights not in REMAINDER_WEIGHTS:
        raise ConfigError(f"remainder_weights={remainder_weights!r} must be one of {list(REMAINDER_WEIGHTS)}")
    if k < 1:
        raise ConfigError(f"rx k={k} must be >= 1")
    if solver in SINGLESTEP_2ND and k > 2:
        raise ConfigError(f"rx with solver={solver!r} supports k in (1, 2), got k={k}")
    multistep = solver == "dpmpp_2m"
    sig_t = check_grid(sigmas, min_steps=k * (2 if multistep else 1), name="sigmas")
    sig = sig_t.tolist()
    n = len(sig) - 1
    order = SOLVER_ORDER[solver]
    if k == 1:
        plan = [(0, n, False)]
    else:
        # Steps into sigma = 0 are first order for 2M / Heun / DPM-Solver-2 (Euler there): keep them plain.
        last_plain = solver != "euler" and sig[-1] == 0.0
        plan = rx_plan(n, k, skip_last or solver in SINGLESTEP_2ND, multistep, last_plain)
    if solver in SINGLESTEP_2ND:
        return _rx_singlestep(denoiser, x, sig_t, plan, solver, coefficients)
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
            n_weighted = k if remainder_weights == "official" and b - a > k else None
            x, est = _extrapolate(x, x_coarse, sig_t[a : b + 1], order, coefficients, n_weighted)
            estimates.append(est)
        c_prev, cs_prev = d_a, sig[a]
    est = torch.stack(estimates) if estimates else None
    return SampleOutput(x, nfe, est)


def _rx_singlestep(
    denoiser: Denoiser, x: Tensor, sig_t: Tensor, plan: list[tuple[int, int, bool]], solver: str, coefficients: str
) -> SampleOutput:
    """RX on Heun / DPM-Solver-2 (k = 2 intervals from :func:`heun_interval` / :func:`dpm2_interval`)."""
    sig = sig_t.tolist()
    base_step = heun_step if solver == "heun" else dpm2_step
    interval = heun_interval if solver == "heun" else dpm2_interval
    nfe, estimates = 0, []
    for a, b, extrapolate in plan:
        if extrapolate:
            x_fine, x_coarse = interval(denoiser, x, sig[a], sig[a + 1], sig[b])
            nfe += 4
            x, est = _extrapolate(x_fine, x_coarse, sig_t[a : b + 1], SOLVER_ORDER[solver], coefficients)
            estimates.append(est)
            continue
        for j in range(a, b):
            x, used = base_step(denoiser, x, sig[j], sig[j + 1])
            nfe += used
    return SampleOutput(x, nfe, torch.stack(estimates) if estimates else None)
