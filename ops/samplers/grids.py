"""Time/noise grids of the probability-flow ODE samplers and their validation.

Every sampler in :mod:`ops.samplers` works on the EDM form of the PF-ODE (Karras et al. 2022, Eq. (4) with
``s(t)=1``): ``dx/dsigma = (x - D(x, sigma)) / sigma`` on a strictly decreasing grid ``sigma_0 > ... > sigma_N >= 0``.
A VP diffusion ``x_t = alpha_t x_0 + sigma_t z`` maps onto it exactly with ``x~ = x_t / alpha_t`` and
``sigma~ = sigma_t / alpha_t`` (the DDIM ``gamma`` grid of the RX-DPM code), so one set of solvers serves both.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from core.errors import ConfigError


def check_grid(sigmas: Tensor, min_steps: int = 1, name: str = "sigmas") -> Tensor:
    """Validate a noise grid and return it as float64 [N+1].

    Raises:
        ConfigError: not 1-D, fewer than ``min_steps`` steps, non-finite, a negative sigma, a zero anywhere but last,
            or not strictly decreasing.
    """
    s = torch.as_tensor(sigmas, dtype=torch.float64)
    if s.ndim != 1 or s.numel() < 2:
        raise ConfigError(f"{name} must be a 1-D grid with at least 2 points, got shape {tuple(s.shape)}")
    n = s.numel() - 1
    if n < min_steps:
        raise ConfigError(f"{name} has {n} steps (NFE budget) but the solver needs at least {min_steps}")
    if not bool(torch.isfinite(s).all()):
        raise ConfigError(f"{name} must be finite, got {s.tolist()}")
    if bool((s < 0).any()):
        i = int(torch.nonzero(s < 0)[0])
        raise ConfigError(f"{name}[{i}]={s[i].item()} is a negative sigma; sigmas must be >= 0")
    if bool((s[:-1] == 0).any()):
        raise ConfigError(f"{name} may reach 0 only at its last point, got {s.tolist()}")
    bad = torch.nonzero(s[1:] >= s[:-1])
    if bad.numel():
        i = int(bad[0])
        raise ConfigError(
            f"{name} must be strictly decreasing (non-monotone time grid): {name}[{i}]={s[i].item()} "
            f"<= {name}[{i + 1}]={s[i + 1].item()}"
        )
    return s


def karras_sigmas(
    n_steps: int, sigma_min: float = 0.002, sigma_max: float = 80.0, rho: float = 7.0, append_zero: bool = True
) -> Tensor:
    """EDM grid (Karras et al. 2022, Eq. (5)): sigma_i = (smax^(1/rho) + i/(N-1) (smin^(1/rho) - smax^(1/rho)))^rho.

    Args:
        n_steps: Number of solver steps N (intervals). With ``append_zero`` the grid is N Karras points
            sigma_0..sigma_{N-1} (sigma_max..sigma_min) followed by sigma_N = 0, as in EDM.
        sigma_min, sigma_max, rho: EDM defaults 0.002, 80, 7.
        append_zero: Append sigma_N = 0 (EDM). Without it the grid is N+1 Karras points ending at sigma_min.

    Returns:
        float64 [N+1], strictly decreasing.
    """
    if n_steps < 1:
        raise ConfigError(f"n_steps={n_steps} must be >= 1")
    if not 0 < sigma_min < sigma_max:
        raise ConfigError(f"need 0 < sigma_min={sigma_min} < sigma_max={sigma_max}")
    if rho <= 0:
        raise ConfigError(f"rho={rho} must be > 0")
    m = n_steps if append_zero else n_steps + 1
    i = torch.arange(m, dtype=torch.float64)
    frac = i / max(m - 1, 1)
    s = (sigma_max ** (1 / rho) + frac * (sigma_min ** (1 / rho) - sigma_max ** (1 / rho))) ** rho
    if m == 1:
        s = torch.tensor([sigma_max], dtype=torch.float64)
    if append_zero:
        s = torch.cat([s, s.new_zeros(1)])
    return s


def vp_alpha_sigma(t: Tensor, beta_min: float = 0.1, beta_max: float = 20.0) -> tuple[Tensor, Tensor]:
    """Linear-beta VP schedule (Song et al. 2021): log alpha_t = -t^2 (bmax - bmin)/4 - t bmin/2,
    sigma_t^2 = 1 - alpha_t^2. Returns (alpha_t, sigma_t), float64 like t."""
    t = torch.as_tensor(t, dtype=torch.float64)
    log_alpha = -0.25 * t**2 * (beta_max - beta_min) - 0.5 * t * beta_min
    alpha = torch.exp(log_alpha)
    return alpha, torch.sqrt(-torch.expm1(2 * log_alpha))


def vp_time_grid(
    n_steps: int,
    t_max: float = 1.0,
    t_min: float = 1e-3,
    kind: str = "uniform",
    beta_min: float = 0.1,
    beta_max: float = 20.0,
) -> Tensor:
    """VP time grid t_0 = t_max > ... > t_N = t_min: ``uniform`` in t (DDIM) or ``logsnr`` (uniform in lambda, the
    DPM-Solver default). Returns float64 [N+1]."""
    if n_steps < 1:
        raise ConfigError(f"n_steps={n_steps} must be >= 1")
    if not 0 < t_min < t_max:
        raise ConfigError(f"need 0 < t_min={t_min} < t_max={t_max}")
    if kind == "uniform":
        return torch.linspace(t_max, t_min, n_steps + 1, dtype=torch.float64)
    if kind == "logsnr":
        alpha, sigma = vp_alpha_sigma(torch.tensor([t_max, t_min]), beta_min, beta_max)
        lam = torch.log(alpha / sigma)
        lams = torch.linspace(float(lam[0]), float(lam[1]), n_steps + 1, dtype=torch.float64)
        return vp_t_from_lambda(lams, beta_min, beta_max)
    raise ConfigError(f"kind={kind!r} must be 'uniform' or 'logsnr'")


def vp_t_from_lambda(lam: Tensor, beta_min: float = 0.1, beta_max: float = 20.0) -> Tensor:
    """Invert lambda(t) = log(alpha_t / sigma_t) for the linear-beta schedule (DPM-Solver, App. of Lu et al. 2022)."""
    log_alpha = -0.5 * torch.log1p(torch.exp(-2 * lam))  # alpha^2 = 1 / (1 + e^{-2 lambda})
    db = beta_max - beta_min
    # 0.25 db t^2 + 0.5 bmin t + log_alpha = 0
    return (-0.5 * beta_min + torch.sqrt(0.25 * beta_min**2 - db * log_alpha)) / (0.5 * db)


def vp_sigmas(t_grid: Tensor, beta_min: float = 0.1, beta_max: float = 20.0) -> tuple[Tensor, Tensor]:
    """Map a VP time grid to the EDM form: returns (sigma~ = sigma_t/alpha_t, alpha_t), both float64 [N+1]."""
    alpha, sigma = vp_alpha_sigma(t_grid, beta_min, beta_max)
    return sigma / alpha, alpha


def step_ratio_exponent_sum(fine: Tensor, exponent: float) -> float:
    """a = sum_m ((s_m - s_{m+1}) / (s_0 - s_k))^exponent over a fine sub-grid [k+1] (the RX local-error weight)."""
    f = torch.as_tensor(fine, dtype=torch.float64)
    h = f[:-1] - f[1:]
    return float(((h / (f[0] - f[-1])) ** exponent).sum())


def log_ratio(a: float, b: float) -> float:
    """log(a / b) for positive a, b (the DPM-Solver step size h in lambda = -log sigma)."""
    return math.log(a / b)
