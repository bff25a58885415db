"""High-accuracy reference solution of the PF-ODE with scipy ``solve_ivp`` (the parity oracle of every sampler).

The EDM PF-ODE written with the score, dx/dsigma = (x - D)/sigma = -sigma grad log p_sigma(x) (Tweedie), is
regular down to sigma = 0, so the reference can integrate to the end of an EDM grid.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from scipy.integrate import solve_ivp
from torch import Tensor

ScoreFn = Callable[[Tensor, Tensor], Tensor]


def reference_solve(
    score: ScoreFn, x: Tensor, sigma_start: float, sigma_end: float, rtol: float = 1e-11, atol: float = 1e-11
) -> Tensor:
    """Integrate dx/dsigma = -sigma score(x, sigma) from sigma_start to sigma_end with DOP853.

    Args:
        score: grad log p_sigma, (x [B, d], sigma [B]) -> [B, d].
        x: Start states [B, d] (all points are solved as one system).
        sigma_start, sigma_end: Integration interval (decreasing).
        rtol, atol: Tolerances of ``solve_ivp``.

    Returns:
        float64 [B, d] at sigma_end.
    """
    shape = x.shape

    def rhs(s: float, y: np.ndarray) -> np.ndarray:
        xt = torch.from_numpy(y).reshape(shape)
        with torch.no_grad():
            out = -s * score(xt, xt.new_full((shape[0],), s))
        return out.reshape(-1).numpy()

    y0 = x.detach().double().reshape(-1).numpy()
    sol = solve_ivp(rhs, (sigma_start, sigma_end), y0, method="DOP853", rtol=rtol, atol=atol)
    if not sol.success:
        raise RuntimeError(f"reference solve failed: {sol.message}")
    return torch.from_numpy(sol.y[:, -1]).reshape(shape)
