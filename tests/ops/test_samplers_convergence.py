"""Every sampler against a scipy ``solve_ivp`` (DOP853, rtol 1e-10) reference of the same PF-ODE on an exact-score
2-D mixture, and the measured convergence order of each solver with and without RX."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ops.samplers import karras_sigmas, rx_sample, sample
from ops.samplers.reference import reference_solve
from ops.scores.gmm import gmm_denoiser, gmm_score

D64 = torch.float64
SMAX, SMIN = 5.0, 0.05
STEPS = (32, 64, 128)


@pytest.fixture(scope="module")
def problem():
    w = torch.tensor([0.3, 0.7], dtype=D64)
    mu = torch.tensor([[-2.0, 0.5], [1.5, -1.0]], dtype=D64)
    cov = torch.tensor([[[0.3, 0.1], [0.1, 0.2]], [[0.1, 0.0], [0.0, 0.4]]], dtype=D64)
    x = torch.randn(6, 2, generator=torch.Generator().manual_seed(0), dtype=D64) * SMAX
    ref = reference_solve(lambda y, s: gmm_score(y, s, w, mu, cov), x, SMAX, SMIN, rtol=1e-10, atol=1e-10)
    den = lambda y, s: gmm_denoiser(y, s, w, mu, cov)  # noqa: E731
    return den, x, ref


RUNS = {
    "euler": lambda den, x, s: sample(den, x, s, "euler"),
    "heun": lambda den, x, s: sample(den, x, s, "heun"),
    "dpm2": lambda den, x, s: sample(den, x, s, "dpm2"),
    "dpmpp_2m": lambda den, x, s: sample(den, x, s, "dpmpp_2m"),
    "rx_euler": lambda den, x, s: rx_sample(den, x, s, "euler", k=2),
    "rx_euler_naive": lambda den, x, s: rx_sample(den, x, s, "euler", k=2, coefficients="naive"),
    "rx_dpmpp_2m": lambda den, x, s: rx_sample(den, x, s, "dpmpp_2m", k=2),
    "rx_heun": lambda den, x, s: rx_sample(den, x, s, "heun", k=2),
    "rx_heun_naive": lambda den, x, s: rx_sample(den, x, s, "heun", k=2, coefficients="naive"),
    "rx_dpm2": lambda den, x, s: rx_sample(den, x, s, "dpm2", k=2),
}
# Expected global orders (Euler 1; the second-order solvers and RX-Euler 2; RX on a second-order solver lifts the
# order towards 3: measured about 2.8 here for RX-Heun / RX-DPM-Solver-2, 2.5-2.9 for RX-2M).
ORDER_RANGE = {
    "euler": (0.9, 1.1),
    "heun": (1.8, 2.2),
    "dpm2": (1.8, 2.2),
    "dpmpp_2m": (1.8, 2.2),
    "rx_euler": (1.75, 2.3),
    "rx_euler_naive": (1.75, 2.3),
    "rx_dpmpp_2m": (2.2, 3.2),
    "rx_heun": (2.5, 3.3),
    "rx_heun_naive": (2.5, 3.3),
    "rx_dpm2": (2.5, 3.3),
}


def _errors(run, den, x, ref) -> list[float]:
    return [
        float((run(den, x, karras_sigmas(n, SMIN, SMAX, append_zero=False)).x - ref).norm(dim=1).mean()) for n in STEPS
    ]


@pytest.mark.parametrize("name", list(RUNS))
def test_sampler_converges_to_reference_with_expected_order(problem, name):
    den, x, ref = problem
    errs = _errors(RUNS[name], den, x, ref)
    order = -np.polyfit(np.log(STEPS), np.log(errs), 1)[0]
    lo, hi = ORDER_RANGE[name]
    assert lo <= order <= hi, f"{name}: errors {errs}, order {order:.2f}"
    # It converges to the scipy solution itself, not just at some rate.
    assert errs[-1] < (0.05 if name == "euler" else 2e-3), errs


def test_rx_beats_its_base_solver_at_equal_nfe(problem):
    den, x, ref = problem
    for base, rx in (("euler", "rx_euler"), ("dpmpp_2m", "rx_dpmpp_2m"), ("heun", "rx_heun"), ("dpm2", "rx_dpm2")):
        e_base, e_rx = _errors(RUNS[base], den, x, ref), _errors(RUNS[rx], den, x, ref)
        assert e_rx[-1] < 0.5 * e_base[-1], (base, e_base, e_rx)
