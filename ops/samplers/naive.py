"""Readable twins of the samplers, written in the *original* VP variables x_t = alpha_t x_0 + sigma_t eps.

They follow the papers' update rules literally (DDIM Eq. (12), DPM-Solver-2 Alg. 1, DPM-Solver++(2M) Alg. 2) with
explicit alpha_t, sigma_t, lambda_t = log(alpha_t / sigma_t), and RX-DPM's coefficients from the 2x2 linear system
(official ``get_coeff``). The fast paths in :mod:`ops.samplers.solvers` / :mod:`ops.samplers.rx` work in the scaled
EDM variables instead; parity tests check both give the same x_0 and gradients in float64.

``data_pred(x_t, i)`` returns D for the state x_t at grid index i (the fine grid is given by ``alphas``/``sigmas``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

DataPred = Callable[[Tensor, float, float], Tensor]  # (x_t, alpha_t, sigma_t) -> D


def _lam(alpha: float, sigma: float) -> float:
    return math.log(alpha / sigma)


def _alpha_sigma_at_lambda(lam: float) -> tuple[float, float]:
    """alpha, sigma of a VP schedule at log-SNR lambda (alpha^2 + sigma^2 = 1)."""
    return math.sqrt(1.0 / (1.0 + math.exp(-2 * lam))), math.sqrt(1.0 / (1.0 + math.exp(2 * lam)))


def naive_ddim(data_pred: DataPred, x: Tensor, alphas: list[float], sigmas: list[float]) -> Tensor:
    """DDIM (eta = 0): x_t = alpha_t D + sigma_t eps_hat with eps_hat = (x_s - alpha_s D) / sigma_s."""
    for (a_s, s_s), (a_t, s_t) in zip(zip(alphas[:-1], sigmas[:-1]), zip(alphas[1:], sigmas[1:])):
        d = data_pred(x, a_s, s_s)
        eps = (x - a_s * d) / s_s
        x = a_t * d + s_t * eps
    return x


def naive_dpm2(data_pred: DataPred, x: Tensor, alphas: list[float], sigmas: list[float]) -> Tensor:
    """DPM-Solver-2 (noise prediction, r1 = 1/2): u = (a_s1/a_s) x - s_s1 (e^{h/2} - 1) eps_s,
    x_t = (a_t/a_s) x - s_t (e^h - 1) eps(u, s1)."""
    for (a_s, s_s), (a_t, s_t) in zip(zip(alphas[:-1], sigmas[:-1]), zip(alphas[1:], sigmas[1:])):
        h = _lam(a_t, s_t) - _lam(a_s, s_s)
        a_1, s_1 = _alpha_sigma_at_lambda(_lam(a_s, s_s) + h / 2)
        eps_s = (x - a_s * data_pred(x, a_s, s_s)) / s_s
        u = (a_1 / a_s) * x - s_1 * math.expm1(h / 2) * eps_s
        eps_1 = (u - a_1 * data_pred(u, a_1, s_1)) / s_1
        x = (a_t / a_s) * x - s_t * math.expm1(h) * eps_1
    return x


def naive_dpmpp_2m(data_pred: DataPred, x: Tensor, alphas: list[float], sigmas: list[float]) -> Tensor:
    """DPM-Solver++(2M): x_t = (s_t/s_s) x - a_t (e^{-h} - 1) D', D' = (1 + 1/(2r)) D_s - 1/(2r) D_prev."""
    d_prev, h_prev = None, None
    for (a_s, s_s), (a_t, s_t) in zip(zip(alphas[:-1], sigmas[:-1]), zip(alphas[1:], sigmas[1:])):
        h = _lam(a_t, s_t) - _lam(a_s, s_s)
        d = data_pred(x, a_s, s_s)
        d_eff = d if d_prev is None else (1 + 1 / (2 * h_prev / h)) * d - 1 / (2 * h_prev / h) * d_prev
        x = (s_t / s_s) * x - a_t * math.expm1(-h) * d_eff
        d_prev, h_prev = d, h
    return x


def naive_edm_euler(denoiser: Callable[[Tensor, Tensor], Tensor], x: Tensor, sigmas: list[float]) -> Tensor:
    """EDM Euler written from the ODE derivative d = (x - D(x, sigma)) / sigma (Karras et al. 2022, Eq. (4))."""
    for s, t in zip(sigmas[:-1], sigmas[1:]):
        x = x + (t - s) * (x - denoiser(x, x.new_full((x.shape[0],), s))) / s
    return x


def naive_rx_euler(
    denoiser: Callable[[Tensor, Tensor], Tensor], x: Tensor, sigmas: list[float], k: int = 2
) -> tuple[Tensor, int]:
    """RX-Euler as the official EDM code does it: per k-step interval a fine and a coarse Euler solution and
    c = first row of inv([[1, 1], [1, a]]), a = sum ((s_m - s_{m+1}) / (s_a - s_b))^2; remainder un-extrapolated."""
    nfe, i, n = 0, 0, len(sigmas) - 1
    while i < n:
        j = min(i + k, n)
        fine = x
        d0 = None
        for m in range(i, j):
            d = denoiser(fine, fine.new_full((x.shape[0],), sigmas[m]))
            nfe += 1
            d0 = d if d0 is None else d0
            fine = fine + (sigmas[m + 1] - sigmas[m]) * (fine - d) / sigmas[m]
        if j - i == k and k > 1:
            coarse = x + (sigmas[j] - sigmas[i]) * (x - d0) / sigmas[i]
            a = sum(((sigmas[m] - sigmas[m + 1]) / (sigmas[i] - sigmas[j])) ** 2 for m in range(i, j))
            c = torch.linalg.inv(torch.tensor([[1.0, 1.0], [1.0, a]], dtype=torch.float64))[0]
            x = float(c[0]) * coarse + float(c[1]) * fine
        else:
            x = fine
        i = j
    return x, nfe


def naive_rx_second_order(
    denoiser: Callable[[Tensor, Tensor], Tensor], x: Tensor, sigmas: list[float], solver: str, a_exponent: int = 3
) -> tuple[Tensor, int]:
    """RX on Heun / DPM-Solver-2 written generically: on every k = 2 interval (not ending at 0) the missing coarse stage
    is fitted by solving, for (e1, e2, g), the stage model f(stage) = f_a + e1 d + e2 d^2 - g l^2 (d = sigma - sigma_a,
    l = length of the Euler predictor leading to the stage) on the three other fine calls, then evaluated at the
    coarse stage; the coefficients are the first row of inv([[1, 1], [1, a]]) with a = sum (h_m / H)^3 (official
    ``get_coeff`` with exponent p + 1). Remainder and a last step into 0 are plain base steps."""

    def f(y: Tensor, s: float) -> Tensor:
        return (y - denoiser(y, y.new_full((y.shape[0],), s))) / s

    nfe, i, n = 0, 0, len(sigmas) - 1
    while i < n:
        if i + 2 <= n and sigmas[i + 2] > 0:
            sa, s1, sb = sigmas[i], sigmas[i + 1], sigmas[i + 2]
            fa = f(x, sa)
            if solver == "heun":
                g1 = f(x + (s1 - sa) * fa, s1)
                x1 = x + (s1 - sa) / 2 * (fa + g1)
                f1 = f(x1, s1)
                g2 = f(x1 + (sb - s1) * f1, sb)
                fine = x1 + (sb - s1) / 2 * (f1 + g2)
                # (delta, euler length) of the stages g1, f1, g2 and of the coarse target
                geo = [(s1 - sa, s1 - sa), (s1 - sa, 0.0), (sb - sa, sb - s1)]
                tgt = (sb - sa, sb - sa)
            else:
                m1, m2, mc = math.sqrt(sa * s1), math.sqrt(s1 * sb), math.sqrt(sa * sb)
                g1 = f(x + (m1 - sa) * fa, m1)
                x1 = x + (s1 - sa) * g1
                f1 = f(x1, s1)
                g2 = f(x1 + (m2 - s1) * f1, m2)
                fine = x1 + (sb - s1) * g2
                geo = [(m1 - sa, m1 - sa), (s1 - sa, 0.0), (m2 - sa, m2 - s1)]
                tgt = (mc - sa, mc - sa)
            nfe += 4
            m = torch.tensor([[d, d * d, -(ll * ll)] for d, ll in geo], dtype=torch.float64)
            rhs = torch.stack([(v - fa).flatten() for v in (g1, f1, g2)]).double()
            e1, e2, g = torch.linalg.solve(m, rhs)
            stage = fa + (e1 * tgt[0] + e2 * tgt[0] ** 2 - g * tgt[1] ** 2).reshape(fa.shape).to(fa.dtype)
            coarse = x + (sb - sa) / 2 * (fa + stage) if solver == "heun" else x + (sb - sa) * stage
            a = ((sa - s1) / (sa - sb)) ** a_exponent + ((s1 - sb) / (sa - sb)) ** a_exponent
            c = torch.linalg.inv(torch.tensor([[1.0, 1.0], [1.0, a]], dtype=torch.float64))[0]
            x = float(c[0]) * coarse + float(c[1]) * fine
            i += 2
            continue
        sa, sb = sigmas[i], sigmas[i + 1]
        fa = f(x, sa)
        nfe += 1
        if sb == 0:
            x = x + (sb - sa) * fa
        elif solver == "heun":
            x = x + (sb - sa) / 2 * (fa + f(x + (sb - sa) * fa, sb))
            nfe += 1
        else:
            mid = math.sqrt(sa * sb)
            x = x + (sb - sa) * f(x + (mid - sa) * fa, mid)
            nfe += 1
        i += 1
    return x, nfe
