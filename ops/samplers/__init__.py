"""Probability-flow ODE samplers (EDM and VP) and RX-DPM extrapolation (rx_dpm)."""

from __future__ import annotations

from ops.samplers.grids import check_grid, karras_sigmas, vp_alpha_sigma, vp_sigmas, vp_time_grid
from ops.samplers.rx import rx_coeffs, rx_sample
from ops.samplers.solvers import (
    SAMPLERS,
    SOLVER_ORDER,
    SampleOutput,
    dpm2_sampler,
    dpmpp_2m_sampler,
    euler_sampler,
    heun_sampler,
    nfe_of,
    recording,
    sample,
    steps_for_nfe,
)

__all__ = [
    "SAMPLERS",
    "SOLVER_ORDER",
    "SampleOutput",
    "check_grid",
    "dpm2_sampler",
    "dpmpp_2m_sampler",
    "euler_sampler",
    "heun_sampler",
    "karras_sigmas",
    "nfe_of",
    "recording",
    "rx_coeffs",
    "rx_sample",
    "sample",
    "steps_for_nfe",
    "vp_alpha_sigma",
    "vp_sigmas",
    "vp_time_grid",
]
