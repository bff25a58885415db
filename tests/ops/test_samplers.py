"""PF-ODE samplers and RX-DPM: grids, bad input, coefficients, NFE, and float64 parity of the fast (scaled EDM
variables) paths against their naive twins (original VP variables, official RX coefficients)."""

from __future__ import annotations

import pytest
import torch

from core.errors import ConfigError
from ops.samplers import (
    check_grid,
    karras_sigmas,
    rx_coeffs,
    rx_sample,
    sample,
    steps_for_nfe,
    vp_alpha_sigma,
    vp_sigmas,
    vp_time_grid,
)
from ops.samplers.naive import (
    naive_ddim,
    naive_dpm2,
    naive_dpmpp_2m,
    naive_edm_euler,
    naive_rx_euler,
    naive_rx_second_order,
)
from ops.samplers.rx import dpm2_interval, heun_interval, rx_plan
from ops.scores.gmm import gmm_denoiser

D64 = torch.float64


@pytest.fixture
def gmm():
    w = torch.tensor([0.3, 0.7], dtype=D64)
    mu = torch.tensor([[-2.0, 0.5], [1.5, -1.0]], dtype=D64)
    cov = torch.tensor([[[0.3, 0.1], [0.1, 0.2]], [[0.1, 0.0], [0.0, 0.4]]], dtype=D64)
    return w, mu, cov


def test_karras_grid_matches_edm_formula():
    s = karras_sigmas(5, 0.002, 80.0, 7.0)
    assert s.shape == (6,) and s[-1] == 0
    assert s[0].item() == pytest.approx(80.0) and s[4].item() == pytest.approx(0.002)
    mid = (80 ** (1 / 7) + 0.5 * (0.002 ** (1 / 7) - 80 ** (1 / 7))) ** 7
    assert s[2].item() == pytest.approx(mid, rel=1e-12)
    assert karras_sigmas(5, 0.1, 10.0, append_zero=False)[-1].item() == pytest.approx(0.1)


def test_vp_grids_and_logsnr_inverse():
    t = vp_time_grid(8, kind="logsnr")
    alpha, sigma = vp_alpha_sigma(t)
    lam = torch.log(alpha / sigma)
    assert torch.allclose(lam[1:] - lam[:-1], (lam[1] - lam[0]).expand(8), atol=1e-9)
    assert t[0].item() == pytest.approx(1.0) and t[-1].item() == pytest.approx(1e-3)
    sig, a = vp_sigmas(t)
    assert torch.allclose(a**2 * (1 + sig**2), torch.ones_like(a), atol=1e-12)


@pytest.mark.parametrize(
    ("grid", "match"),
    [
        ([5.0, 1.0, 2.0, 0.0], "non-monotone"),
        ([5.0, 1.0, -0.5], "negative sigma"),
        ([5.0, 0.0, 0.0], "only at its last point"),
        ([5.0], "at least 2 points"),
        ([5.0, float("nan"), 0.0], "finite"),
    ],
)
def test_bad_grids_raise_clear_errors(grid, match):
    with pytest.raises(ConfigError, match=match):
        check_grid(torch.tensor(grid))
    with pytest.raises(ConfigError, match=match):
        sample(lambda x, s: x, torch.zeros(2, 2), torch.tensor(grid), "heun")


def test_nfe_smaller_than_order_and_rx_budget_errors():
    with pytest.raises(ConfigError, match="smaller than the order 2"):
        steps_for_nfe("heun", 1)
    assert steps_for_nfe("heun", 9, ends_at_zero=True) == 5 and steps_for_nfe("euler", 3) == 3
    with pytest.raises(ConfigError, match="needs at least 2"):
        rx_sample(lambda x, s: x, torch.zeros(2, 2), torch.tensor([1.0, 0.0]), k=2)
    with pytest.raises(ConfigError, match="rx solver='rk4'"):
        rx_sample(lambda x, s: x, torch.zeros(2, 2), karras_sigmas(4), "rk4")
    with pytest.raises(ConfigError, match="supports k in"):
        rx_sample(lambda x, s: x, torch.zeros(2, 2), karras_sigmas(6), "heun", k=3)
    with pytest.raises(ConfigError, match="sigma=-1.0 must be >= 0"):
        gmm_denoiser(torch.zeros(2, 2), -1.0, torch.ones(1), torch.zeros(1, 2), torch.eye(2)[None])


def test_rx_coefficients_uniform_and_adapted():
    assert rx_coeffs(torch.tensor([2.0, 1.0, 0.0])) == pytest.approx((-1.0, 2.0))
    assert rx_coeffs(torch.tensor([3.0, 2.0, 1.0, 0.0]), order=1) == pytest.approx((-0.5, 1.5))  # a = 1/3
    assert rx_coeffs(torch.tensor([2.0, 1.0, 0.0]), order=2) == pytest.approx((-1 / 3, 4 / 3))  # a = 1/4
    # Non-uniform interval: a = (3/4)^2 + (1/4)^2 = 5/8 -> c_coarse = a/(a-1) = -5/3, c_fine = 8/3.
    cc, cf = rx_coeffs(torch.tensor([4.0, 1.0, 0.0]))
    assert (cc, cf) == pytest.approx((-5 / 3, 8 / 3)) and cc + cf == pytest.approx(1.0)
    assert rx_coeffs(torch.tensor([4.0, 1.0, 0.0]), coefficients="naive") == pytest.approx((-1.0, 2.0))


def test_rx_plan_remainder():
    assert rx_plan(7, 2, skip_last=True, first_plain=False, last_plain=False) == [
        (0, 2, True),
        (2, 4, True),
        (4, 6, True),
        (6, 7, False),
    ]
    assert rx_plan(7, 2, skip_last=False, first_plain=False, last_plain=False)[-1] == (4, 7, True)
    assert rx_plan(7, 2, True, first_plain=True, last_plain=True) == [
        (0, 2, False),
        (2, 4, True),
        (4, 6, True),
        (6, 7, False),
    ]


def test_rx_remainder_interval_weights_consistent_and_official():
    """Grid 4, 3, 2, 0 with k = 2 and skip_last=False: one interval of 3 fine steps (h = 1, 1, 2; H = 4).
    Consistent a = (1/16 + 1/16 + 4/16) = 3/8 -> (c_coarse, c_fine) = (-3/5, 8/5); official get_coeff sums the
    first k = 2 steps only: a = 1/8 -> (-1/7, 8/7). With D(x, s) = x / 2 (so f = x / (2 s)) and x_0 = 1, the fine
    Euler solution is (7/8)(5/6)(1/2) = 35/96 and the coarse one 1/2, so x = 8/5 35/96 - 3/5 1/2 = 17/60
    (consistent) and 8/7 35/96 - 1/7 1/2 = 29/84 (official)."""
    grid = torch.tensor([4.0, 3.0, 2.0, 0.0], dtype=D64)
    assert rx_coeffs(grid) == pytest.approx((-3 / 5, 8 / 5))
    assert rx_coeffs(grid, n_weighted=2) == pytest.approx((-1 / 7, 8 / 7))
    den = lambda x, s: 0.5 * x  # noqa: E731
    x0 = torch.ones(1, 1, dtype=D64)
    default = rx_sample(den, x0, grid, "euler", k=2, skip_last=False)
    official = rx_sample(den, x0, grid, "euler", k=2, skip_last=False, remainder_weights="official")
    assert default.nfe == official.nfe == 3
    assert float(default.x) == pytest.approx(17 / 60, rel=1e-12)
    assert float(official.x) == pytest.approx(29 / 84, rel=1e-12)
    # Full intervals (no remainder) are unaffected by the flag.
    even = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0], dtype=D64)
    torch.testing.assert_close(
        rx_sample(den, x0, even, "euler", k=2, skip_last=False, remainder_weights="official").x,
        rx_sample(den, x0, even, "euler", k=2, skip_last=False).x,
        rtol=0,
        atol=0,
    )
    with pytest.raises(ConfigError, match="remainder_weights"):
        rx_sample(den, x0, grid, "euler", k=2, remainder_weights="first")


def test_nfe_counts(gmm):
    den = lambda x, s: gmm_denoiser(x, s, *gmm)  # noqa: E731
    x = torch.randn(3, 2, dtype=D64) * 80
    sig = karras_sigmas(8)
    assert sample(den, x, sig, "euler").nfe == 8
    assert sample(den, x, sig, "heun").nfe == 15
    assert sample(den, x, sig, "dpm2").nfe == 15
    assert sample(den, x, sig, "dpmpp_2m").nfe == 8
    calls = []
    out = rx_sample(lambda x, s: calls.append(1) or den(x, s), x, sig, "euler", k=2)
    assert out.nfe == len(calls) == 8 and out.error_estimates.shape == (4, 3)
    assert rx_sample(den, x, sig, "dpmpp_2m", k=2).nfe == 8
    for solver in ("heun", "dpm2"):  # RX on the second-order single-step solvers costs no extra call either
        calls2: list[int] = []
        out = rx_sample(lambda x, s, c=calls2: c.append(1) or den(x, s), x, sig, solver, k=2)
        assert out.nfe == len(calls2) == 15 and out.error_estimates.shape == (3, 3)


def test_rx_k1_is_base_solver(gmm):
    den = lambda x, s: gmm_denoiser(x, s, *gmm)  # noqa: E731
    x = torch.randn(4, 2, dtype=D64) * 80
    sig = karras_sigmas(9)
    for solver in ("euler", "heun", "dpm2", "dpmpp_2m"):
        torch.testing.assert_close(rx_sample(den, x, sig, solver, k=1).x, sample(den, x, sig, solver).x, rtol=0, atol=0)


@pytest.mark.parametrize("n", [8, 9])
def test_rx_euler_matches_official_construction(gmm, n):
    """Fast RX-Euler (closed-form c) vs the official-style twin (explicit coarse/fine, inv([[1,1],[1,a]])):
    outputs and gradients w.r.t. the starting noise and the mixture means, float64."""
    w, mu, cov = gmm
    mu = mu.clone().requires_grad_(True)
    x = (torch.randn(5, 2, dtype=D64) * 80).requires_grad_(True)
    den = lambda y, s: gmm_denoiser(y, s, w, mu, cov)  # noqa: E731
    sig = karras_sigmas(n)
    fast = rx_sample(den, x, sig, "euler", k=2)
    slow, nfe = naive_rx_euler(den, x, sig.tolist(), k=2)
    assert fast.nfe == nfe == n
    torch.testing.assert_close(fast.x, slow, rtol=1e-10, atol=1e-10)
    g_fast = torch.autograd.grad(fast.x.square().sum(), (x, mu))
    g_slow = torch.autograd.grad(slow.square().sum(), (x, mu))
    for a, b in zip(g_fast, g_slow):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    assert not torch.allclose(fast.x, sample(den, x, sig, "euler").x, atol=1e-3)  # extrapolation did something


def test_euler_matches_ode_derivative_form(gmm):
    den = lambda y, s: gmm_denoiser(y, s, *gmm)  # noqa: E731
    x = torch.randn(5, 2, dtype=D64) * 80
    sig = karras_sigmas(12)
    torch.testing.assert_close(sample(den, x, sig, "euler").x, naive_edm_euler(den, x, sig.tolist()))


@pytest.mark.parametrize(
    ("solver", "naive"), [("euler", naive_ddim), ("dpm2", naive_dpm2), ("dpmpp_2m", naive_dpmpp_2m)]
)
def test_vp_solvers_match_original_variable_twins(gmm, solver, naive):
    """The scaled EDM-form solvers on the VP gamma grid equal DDIM / DPM-Solver-2 / DPM-Solver++(2M) written in the
    original VP variables (alpha_t, sigma_t, lambda_t): outputs and input gradients, float64."""
    w, mu, cov = gmm
    t = vp_time_grid(10, kind="uniform")
    alpha, sigma = vp_alpha_sigma(t)
    sig_tilde = sigma / alpha
    x_orig = torch.randn(6, 2, dtype=D64).requires_grad_(True)
    den = lambda y, s: gmm_denoiser(y, s, w, mu, cov)  # noqa: E731
    data_pred = lambda xt, a, s: gmm_denoiser(xt / a, s / a, w, mu, cov)  # noqa: E731
    fast = float(alpha[-1]) * sample(den, x_orig / float(alpha[0]), sig_tilde, solver).x
    slow = naive(data_pred, x_orig, alpha.tolist(), sigma.tolist())
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-10)
    (gf,) = torch.autograd.grad(fast.sum(), x_orig)
    (gs,) = torch.autograd.grad(slow.sum(), x_orig)
    torch.testing.assert_close(gf, gs, rtol=1e-9, atol=1e-10)


def test_rx_error_estimate_tracks_true_local_error(gmm):
    """On one interval from an exact state, the Richardson estimate a (x_f - x_c)/(a - 1) matches the fine
    solution's true error (vs a 200-step DPM-Solver-2 solve) as the interval shrinks."""
    den = lambda y, s: gmm_denoiser(y, s, *gmm)  # noqa: E731
    x = torch.randn(6, 2, dtype=D64, generator=torch.Generator().manual_seed(0)) * 2
    ratios = []
    for h in (0.4, 0.1):
        sig = torch.tensor([1.0, 1.0 - 0.3 * h, 1.0 - h], dtype=D64)  # non-uniform fine steps
        fine = sample(den, x, sig, "euler").x
        exact = sample(den, x, torch.linspace(1.0, 1.0 - h, 201, dtype=D64), "dpm2").x
        est = rx_sample(den, x, sig, "euler", k=2).error_estimates[0]
        ratios.append(float((est / (fine - exact).norm(dim=1)).median()))
    assert abs(ratios[1] - 1) < 0.1 and abs(ratios[1] - 1) < abs(ratios[0] - 1) + 0.05
    out = rx_sample(den, x, sig, "euler", k=2).x
    assert float((out - exact).norm(dim=1).mean()) < 0.2 * float((fine - exact).norm(dim=1).mean())


@pytest.mark.parametrize("solver", ["heun", "dpm2"])
@pytest.mark.parametrize("n", [6, 7])
def test_rx_second_order_matches_generic_fit_twin(gmm, solver, n):
    """Fast RX-Heun (closed-form coarse stage) / RX-DPM-Solver-2 (precomputed weights) equal the twin that fits the
    stage model per interval and extrapolates with the official 2x2 system, in float64, values and gradients."""
    den = lambda y, s: gmm_denoiser(y, s, *gmm)  # noqa: E731
    x = (torch.randn(4, 2, dtype=D64, generator=torch.Generator().manual_seed(1)) * 5).requires_grad_()
    sig = karras_sigmas(n, 0.002, 5.0)
    fast = rx_sample(den, x, sig, solver, k=2)
    slow, nfe = naive_rx_second_order(den, x, sig.tolist(), solver)
    assert fast.nfe == nfe == sample(den, x.detach(), sig, solver).nfe
    torch.testing.assert_close(fast.x, slow, rtol=1e-11, atol=1e-11)
    (gf,) = torch.autograd.grad(fast.x.sum(), x)
    (gs,) = torch.autograd.grad(slow.sum(), x)
    torch.testing.assert_close(gf, gs, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("solver", ["heun", "dpm2"])
def test_rx_second_order_coarse_stage_and_error_estimate(gmm, solver):
    """The call-free coarse step equals the true one-step base solver up to O(H^4) (it shrinks ~16x when H halves,
    much faster than the O(H^3) local error), and the Richardson estimate tracks the fine solution's true error."""
    den = lambda y, s: gmm_denoiser(y, s, *gmm)  # noqa: E731
    interval = heun_interval if solver == "heun" else dpm2_interval
    x = torch.randn(6, 2, dtype=D64, generator=torch.Generator().manual_seed(0)) * 2
    gaps, ratios = [], []
    for h in (0.2, 0.1, 0.05):
        sa, s1, sb = 1.0, 1.0 - 0.4 * h, 1.0 - h  # non-uniform fine steps
        fine, coarse = interval(den, x, sa, s1, sb)
        true_coarse = sample(den, x, torch.tensor([sa, sb], dtype=D64), solver).x
        exact = sample(den, x, torch.linspace(sa, sb, 201, dtype=D64), "dpm2").x
        gaps.append(float((coarse - true_coarse).norm(dim=1).max()))
        est = rx_sample(den, x, torch.tensor([sa, s1, sb], dtype=D64), solver, k=2).error_estimates[0]
        ratios.append(float((est / (fine - exact).norm(dim=1)).median()))
    assert gaps[0] / gaps[1] > 11 and gaps[1] / gaps[2] > 11, gaps  # an O(H^3) gap would shrink 8x, O(H^4) 16x
    assert abs(ratios[-1] - 1) < 0.15 and abs(ratios[-1] - 1) <= abs(ratios[0] - 1) + 0.05, ratios
