"""Exact Gaussian-mixture scores (float64 parity against autograd twins) and the sgm_lipschitz bound helpers."""

from __future__ import annotations

import math

import pytest
import torch

from core.errors import ConfigError
from ops.scores import gmm_denoiser, gmm_hessian, gmm_score, naive_gmm_denoiser, naive_gmm_hessian
from ops.scores.gmm import check_gmm, gmm_log_prob, gmm_sample
from ops.scores.lipschitz import (
    blowup_time,
    heat_hessian_1d,
    heat_hessian_points,
    lower_hessian_bound,
    ou_to_heat,
    score_jacobian,
    semiconvex_bound,
    spectral_norm_sym,
)

D64 = torch.float64


def _gmm(d: int = 3, k: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(k, d, d, generator=g, dtype=D64)
    covs = 0.2 * torch.eye(d, dtype=D64) + a @ a.transpose(1, 2) * 0.1
    w = torch.rand(k, generator=g, dtype=D64) + 0.2
    return w / w.sum(), torch.randn(k, d, generator=g, dtype=D64) * 2, covs


@pytest.mark.parametrize("sigma", [0.0, 0.3, 5.0])
def test_denoiser_score_hessian_match_autograd(sigma):
    w, mu, cov = _gmm()
    x = torch.randn(7, 3, dtype=D64) * 2
    torch.testing.assert_close(gmm_denoiser(x, sigma, w, mu, cov), naive_gmm_denoiser(x, sigma, w, mu, cov))
    torch.testing.assert_close(gmm_hessian(x, sigma, w, mu, cov), naive_gmm_hessian(x, sigma, w, mu, cov))
    if sigma > 0:  # Tweedie
        torch.testing.assert_close(gmm_score(x, sigma, w, mu, cov), (gmm_denoiser(x, sigma, w, mu, cov) - x) / sigma**2)


def test_hessian_gradients_match_autograd_twin():
    w, mu, cov = _gmm(d=2, k=2)
    mu = mu.clone().requires_grad_(True)
    x = torch.randn(4, 2, dtype=D64)
    (g1,) = torch.autograd.grad(gmm_hessian(x, 0.5, w, mu, cov).sum(), mu)
    (g2,) = torch.autograd.grad(naive_gmm_hessian(x, 0.5, w, mu, cov).sum(), mu)
    torch.testing.assert_close(g1, g2)


def test_single_gaussian_closed_form_and_sampling():
    cov = torch.tensor([[[2.0, 0.5], [0.5, 1.0]]], dtype=D64)
    mu = torch.tensor([[1.0, -1.0]], dtype=D64)
    w = torch.ones(1, dtype=D64)
    x = torch.randn(5, 2, dtype=D64)
    prec = torch.linalg.inv(cov[0] + 0.25 * torch.eye(2, dtype=D64))
    torch.testing.assert_close(gmm_hessian(x, 0.5, w, mu, cov), -prec.expand(5, 2, 2))
    lp = torch.distributions.MultivariateNormal(mu[0], cov[0] + 0.25 * torch.eye(2, dtype=D64)).log_prob(x)
    torch.testing.assert_close(gmm_log_prob(x, 0.5, w, mu, cov), lp)
    s = gmm_sample(20000, w, mu, cov, torch.Generator().manual_seed(0))
    assert torch.allclose(s.mean(0), mu[0], atol=0.05) and torch.allclose(torch.cov(s.T), cov[0], atol=0.08)


def test_check_gmm_rejects_bad_parameters():
    w, mu, cov = _gmm()
    with pytest.raises(ConfigError, match="sum to 1"):
        check_gmm(w * 2, mu, cov)
    with pytest.raises(ConfigError, match="positive definite"):
        check_gmm(w, mu, -cov)


def test_bounds_and_blowup_time():
    k = 1.0
    t_star = blowup_time(k)
    assert ou_to_heat(t_star).item() == pytest.approx(1 / k)
    assert math.isinf(semiconvex_bound(k, t_star + 1e-3).item())
    assert semiconvex_bound(k, 0.0).item() == pytest.approx(k)
    assert lower_hessian_bound(2.0, 0.0).item() == pytest.approx(-2.0)
    assert lower_hessian_bound(2.0, 5.0).item() == pytest.approx(-1.0, abs=1e-3)  # tends to -1 (N(0, 1) limit)


def test_heat_hessian_quadrature_matches_gaussian():
    """p_0 = N(0, s2): d^2 log q_v = -1/(s2 + v) exactly; the quadrature and the point-measure version agree."""
    s2, v = 0.5, 0.3
    x0 = torch.linspace(-12, 12, 4001, dtype=D64)
    y = torch.linspace(-2, 2, 9, dtype=D64)
    h = heat_hessian_1d(x0, -(x0**2) / (2 * s2), y, v)
    torch.testing.assert_close(h, torch.full_like(h, -1 / (s2 + v)), rtol=1e-6, atol=1e-6)
    h2 = heat_hessian_points(x0[:, None], -(x0**2) / (2 * s2), y[:, None], v)[:, 0, 0]
    torch.testing.assert_close(h2, h)


def test_score_jacobian_of_exact_denoiser_is_hessian():
    w, mu, cov = _gmm(d=2, k=3)
    x = torch.randn(4, 2, dtype=D64)
    jac = score_jacobian(lambda y, s: gmm_denoiser(y, s, w, mu, cov), x, 0.4)
    torch.testing.assert_close(jac, gmm_hessian(x, 0.4, w, mu, cov))
    assert spectral_norm_sym(-torch.eye(2, dtype=D64)[None] * 3).item() == pytest.approx(3.0)


def test_piecewise_quadratic_semiconvexity_bound_is_sharp_and_finite_time():
    """sup_y d^2 log q_v <= K/(1 - K v) for v < 1/K; near v = 1/K the sup grows with the stretch length R
    (the blow-up mechanism), while a wider stretch does not break the bound."""
    from ops.scores.lipschitz import piecewise_quadratic_logp

    k = 1.0
    sups = {}
    for r in (1.0, 3.0):
        x0 = torch.arange(-2 * r - 9, 2 * r + 9, 0.01, dtype=D64)
        lp = piecewise_quadratic_logp(x0, k, r)
        y = torch.linspace(-r, r, 41, dtype=D64)
        for v in (0.2, 0.6, 0.9):
            h = heat_hessian_1d(x0, lp, y, v).max().item()
            assert h <= k / (1 - k * v) + 1e-6
        sups[r] = heat_hessian_1d(x0, lp, y, 1.0 / k).max().item()
    assert sups[3.0] > 4 * sups[1.0] > 0  # grows ~ R^2 at v = 1/K


def test_logconcave_band_and_segment_one_over_t():
    from ops.scores.lipschitz import logconcave_bounds, logconcave_logp

    m = 0.5
    x0 = torch.linspace(-15, 15, 6001, dtype=D64)
    lp = logconcave_logp(x0, m)
    for t in (0.01, 0.3, 2.0):
        v = float(ou_to_heat(t))
        h = math.exp(2 * t) * heat_hessian_1d(x0, lp, torch.linspace(-3, 3, 31, dtype=D64), v)
        lo, hi = logconcave_bounds(m, m + 1, t)
        assert float(h.min()) >= float(lo) - 1e-6 and float(h.max()) <= float(hi) + 1e-6
    # Uniform measure on the segment [-1, 1] x {0} (a manifold with boundary): L(t) ~ 1 / (2t).
    s = torch.linspace(-1, 1, 2001, dtype=D64)
    pts = torch.stack([s, torch.zeros_like(s)], 1)
    y = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.5, 0.01]], dtype=D64)
    for t in (1e-3, 1e-2):
        v = float(ou_to_heat(t))
        lip = math.exp(2 * t) * spectral_norm_sym(heat_hessian_points(pts, torch.zeros(2001, dtype=D64), y, v)).max()
        assert float(lip) * 2 * t == pytest.approx(1.0, rel=0.05)
