"""SEMDICE ops: stationary distributions, the dual and its gradient, recovery, MaxEnt optimum, soft-chi^2, kNN."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
import torch

from core.errors import ConfigError
from ops.semdice import deep
from ops.semdice import tabular as tb
from ops.semdice.maxent import maxent_optimal

GAMMA = 0.95


@pytest.fixture(scope="module")
def mdp():
    return tb.random_mdp(20, 4, 4, 1.0, seed=1)


@pytest.fixture(scope="module")
def optimum(mdp):
    T, p0 = mdp
    return maxent_optimal(T, p0, GAMMA)


def _uniform(S, A):
    return torch.full((S, A), 1.0 / A, dtype=torch.float64)


def test_random_mdp_shape_and_support():
    T, p0 = tb.random_mdp(20, 4, 4, 1.0, seed=3)
    tb.check_transition(T)
    assert T.shape == (20, 4, 20) and float(p0[0]) == 1.0
    assert ((T > 0).sum(-1) == 4).all()  # K = 4 successors per (s, a) (Dirichlet(1) draws are a.s. > 0)
    T2, _ = tb.random_mdp(20, 4, 4, 1.0, seed=3)
    assert torch.equal(T, T2)


def test_stationary_solve_matches_series_and_flow(mdp):
    T, p0 = mdp
    pi = torch.softmax(torch.randn(20, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)), 1)
    d = tb.stationary_distribution(T, p0, pi, GAMMA)
    d_naive = tb.stationary_distribution_series(T, p0, pi, GAMMA)
    torch.testing.assert_close(d, d_naive, rtol=0, atol=1e-13)
    assert abs(float(d.sum()) - 1) < 1e-12
    flow = (1 - GAMMA) * p0 + GAMMA * torch.einsum("sa,sat->t", d, T)
    torch.testing.assert_close(d.sum(1), flow, rtol=0, atol=1e-13)


def test_dual_gradient_closed_form_autograd_finite_differences(mdp):
    T, p0 = mdp
    g = torch.Generator().manual_seed(1)
    d_b = tb.stationary_distribution(T, p0, _uniform(20, 4), GAMMA)
    nu = torch.randn(20, dtype=torch.float64, generator=g).requires_grad_()
    mu = torch.randn(20, dtype=torch.float64, generator=g).requires_grad_()
    alpha = 0.1
    loss = tb.semdice_dual(nu, mu, d_b, T, p0, GAMMA, alpha)
    g_nu, g_mu = torch.autograd.grad(loss, (nu, mu))
    c_nu, c_mu = tb.semdice_dual_grad(nu.detach(), mu.detach(), d_b, T, p0, GAMMA, alpha)
    torch.testing.assert_close(c_nu, g_nu, rtol=0, atol=1e-13)
    torch.testing.assert_close(c_mu, g_mu, rtol=0, atol=1e-13)
    x = torch.cat([nu.detach(), mu.detach()])
    h, fd = 1e-6, torch.zeros(40, dtype=torch.float64)
    for i in range(40):
        xp, xm = x.clone(), x.clone()
        xp[i] += h
        xm[i] -= h
        fd[i] = (
            tb.semdice_dual(xp[:20], xp[20:], d_b, T, p0, GAMMA, alpha)
            - tb.semdice_dual(xm[:20], xm[20:], d_b, T, p0, GAMMA, alpha)
        ) / (2 * h)
    torch.testing.assert_close(fd, torch.cat([c_nu, c_mu]), rtol=0, atol=1e-7)
    assert float(torch.cat([c_nu, c_mu]).abs().max()) > 1e-2  # a non-trivial point


def _solve_dual(T, p0, d_b, alpha):
    S = T.shape[0]

    def f(x):
        x = torch.from_numpy(x)
        loss = tb.semdice_dual(x[:S], x[S:], d_b, T, p0, GAMMA, alpha)
        return float(loss), torch.cat(tb.semdice_dual_grad(x[:S], x[S:], d_b, T, p0, GAMMA, alpha)).numpy()

    res = scipy.optimize.minimize(
        f, np.zeros(2 * S), jac=True, method="L-BFGS-B", options=dict(maxiter=20000, gtol=1e-12, ftol=1e-15)
    )
    x = torch.from_numpy(res.x)
    return x[:S], x[S:]


def test_alpha_to_zero_approaches_maxent_optimum(mdp, optimum):
    """With full-support d_b, the recovered policy's true state entropy approaches the convex optimum as alpha -> 0,
    and the recovered d is the policy's own stationary distribution (one stationary Markov policy)."""
    T, p0 = mdp
    _, _, h_opt = optimum
    d_b = tb.stationary_distribution(T, p0, _uniform(20, 4), GAMMA)
    gaps = []
    for alpha in (1.0, 0.1, 0.01):
        nu, mu = _solve_dual(T, p0, d_b, alpha)
        pi, d = tb.semdice_policy(nu, mu, d_b, T, GAMMA, alpha)
        d_pi = tb.stationary_distribution(T, p0, pi, GAMMA)
        torch.testing.assert_close(d, d_pi, rtol=0, atol=1e-6)
        gaps.append(h_opt - float(tb.state_entropy(d_pi.sum(1))))
    assert gaps[0] > gaps[1] > gaps[2] > 0
    assert gaps[2] < 3e-3 and gaps[0] > 1e-2


def test_maxent_optimum_beats_random_policies(mdp, optimum):
    T, p0 = mdp
    pi, d_s, h = optimum
    torch.testing.assert_close(tb.stationary_distribution(T, p0, pi, GAMMA).sum(1), d_s, rtol=0, atol=1e-6)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        pr = torch.softmax(2 * torch.randn(20, 4, dtype=torch.float64, generator=g), 1)
        assert float(tb.state_entropy(tb.stationary_distribution(T, p0, pr, GAMMA).sum(1))) < h
    h_u = float(tb.state_entropy(tb.stationary_distribution(T, p0, _uniform(20, 4), GAMMA).sum(1)))
    assert tb.normalized_entropy(h_u, h_u, h) == 0 and tb.normalized_entropy(h, h_u, h) == 1


def test_mle_model_and_rewards():
    counts = torch.zeros(3, 2, 3, dtype=torch.float64)
    counts[0, 0] = torch.tensor([1.0, 3.0, 0.0])
    counts[1, 1, 2] = 2.0
    T = tb.mle_model(counts)
    torch.testing.assert_close(T[0, 0], torch.tensor([0.25, 0.75, 0.0], dtype=torch.float64))
    torch.testing.assert_close(T[1, 1], torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(T[2, 0], torch.full((3,), 1 / 3, dtype=torch.float64))  # never tried: uniform
    tb.check_transition(T)
    bonus = tb.count_bonus(torch.tensor([0.0, 1.0, 4.0], dtype=torch.float64))
    assert float(bonus[0]) == 1.0 and float(bonus[2]) == 0.0
    r1 = (1 + 1e-4) ** -0.5
    expected_mid = (r1 - (4 + 1e-4) ** -0.5) / (1e-4**-0.5 - (4 + 1e-4) ** -0.5)
    assert abs(float(bonus[1]) - expected_mid) < 1e-12
    r = tb.state_density_reward(torch.tensor([1.0, 3.0], dtype=torch.float64))
    assert float(r[0]) > float(r[1]) and abs(float(torch.exp(-r).sum()) - 1) < 1e-12


def test_exact_policy_gradient_finite_differences(mdp):
    T, p0 = mdp
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(20, 4, dtype=torch.float64, generator=g).requires_grad_()
    reward = torch.rand(20, dtype=torch.float64, generator=g)
    (grad,) = torch.autograd.grad(tb.expected_reward(logits, T, p0, GAMMA, reward), logits)
    h = 1e-6
    for s, a in [(0, 0), (3, 2), (11, 1)]:
        lp, lm = logits.detach().clone(), logits.detach().clone()
        lp[s, a] += h
        lm[s, a] -= h
        fd = (tb.expected_reward(lp, T, p0, GAMMA, reward) - tb.expected_reward(lm, T, p0, GAMMA, reward)) / (2 * h)
        assert abs(float(fd) - float(grad[s, a])) < 1e-8


def test_bad_inputs():
    T, _ = tb.random_mdp(5, 2, 2, seed=0)
    bad = T.clone()
    bad[2, 1, 0] += 0.3
    with pytest.raises(ConfigError, match=r"T\[2, 1, :\] sums to 1.3"):
        tb.check_transition(bad)
    with pytest.raises(ConfigError, match="shape"):
        tb.check_transition(T[:, :, :4])
    for gamma in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(ConfigError, match=r"must lie in \(0, 1\)"):
            tb.check_gamma(gamma)
    for alpha in (0.0, -1.0, float("nan")):
        with pytest.raises(ConfigError, match="must be > 0"):
            tb.check_alpha(alpha)


# -- deep version ----------------------------------------------------------------------------------------------------
def test_soft_chisq_closed_forms():
    x = torch.linspace(0, 12, 240001, dtype=torch.float64)
    fx = deep.soft_chisq_f(x)
    for yv in (-3.0, -0.7, -1e-3, 0.0, 0.4, 2.5):
        y = torch.tensor(yv, dtype=torch.float64)
        vals = x * y - fx
        i = int(vals.argmax())
        assert abs(float(vals[i]) - float(deep.soft_chisq_f_pos_conj(y))) < 1e-8  # f*_+(y) = max_x xy - f(x)
        assert abs(float(x[i]) - float(deep.soft_chisq_f_prime_inv(y))) < 1e-4  # attained at (f')^{-1}(y)
    # f'((f')^{-1}(y)) = y, by autograd; f and f*_+ are C^1 at their joins
    w = deep.soft_chisq_f_prime_inv(torch.tensor([-2.0, -0.5, 0.3, 1.7], dtype=torch.float64)).requires_grad_()
    (df,) = torch.autograd.grad(deep.soft_chisq_f(w).sum(), w)
    torch.testing.assert_close(df, torch.tensor([-2.0, -0.5, 0.3, 1.7], dtype=torch.float64), rtol=0, atol=1e-12)
    for fn, at in ((deep.soft_chisq_f, 1.0), (deep.soft_chisq_f_pos_conj, 0.0)):
        t = torch.tensor([at - 1e-7, at + 1e-7], dtype=torch.float64, requires_grad=True)
        v = fn(t)
        (gr,) = torch.autograd.grad(v.sum(), t)
        assert abs(float((v[1] - v[0]).detach())) < 1e-6 and abs(float(gr[1] - gr[0])) < 1e-6
    assert float(deep.soft_chisq_f(torch.tensor(1.0))) == 0.0


def test_knn_distance_fast_matches_naive_and_density():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, dtype=torch.float64, generator=g)
    torch.testing.assert_close(deep.knn_mean_distance(x, 6), deep.knn_mean_distance_naive(x, 6), rtol=0, atol=1e-13)
    # a point in a dense cluster gets a higher log-density than an outlier
    x[0] = 0.0
    x[1] = 50.0
    logp = deep.pbe_log_density(x, k=6)
    assert float(logp[0]) > float(logp[1])
    with pytest.raises(ValueError, match="k=40"):
        deep.knn_mean_distance(x, 40)


# -- fused numpy inner loops vs torch autograd SGD (the naive twins) ------------------------------------------------
def test_fused_dual_descent_matches_torch_sgd(mdp):
    from ops.semdice import fused

    T, p0 = mdp
    g = torch.Generator().manual_seed(4)
    d_b = torch.rand(20, 4, dtype=torch.float64, generator=g)
    d_b = d_b / d_b.sum()
    nu = torch.nn.Parameter(torch.randn(20, dtype=torch.float64, generator=g))
    mu = torch.nn.Parameter(torch.randn(20, dtype=torch.float64, generator=g))
    nu0, mu0 = nu.detach().numpy().copy(), mu.detach().numpy().copy()
    opt = torch.optim.SGD([nu, mu], lr=0.5)
    for _ in range(50):
        opt.zero_grad()
        tb.semdice_dual(nu, mu, d_b, T, p0, GAMMA, 0.1).backward()
        opt.step()
    f_nu, f_mu = fused.dual_gradient_descent(nu0, mu0, d_b.numpy(), T.numpy(), p0.numpy(), GAMMA, 0.1, 0.5, 50)
    np.testing.assert_allclose(f_nu, nu.detach().numpy(), rtol=0, atol=1e-11)
    np.testing.assert_allclose(f_mu, mu.detach().numpy(), rtol=0, atol=1e-11)
    assert np.abs(f_nu - nu0).max() > 1e-2  # the iterates moved


@pytest.mark.parametrize("state_reward", [True, False])
def test_fused_policy_gradient_matches_autograd(mdp, state_reward):
    from ops.semdice import fused

    T, p0 = mdp
    g = torch.Generator().manual_seed(5)
    reward = torch.rand(20, dtype=torch.float64, generator=g) if state_reward else torch.rand(20, 4, generator=g)
    reward = reward.double()
    logits = torch.nn.Parameter(torch.randn(20, 4, dtype=torch.float64, generator=g))
    l0 = logits.detach().numpy().copy()
    grad, J = fused.policy_gradient(l0, T.numpy(), p0.numpy(), GAMMA, reward.numpy())
    loss = -tb.expected_reward(logits, T, p0, GAMMA, reward)
    (auto,) = torch.autograd.grad(loss, logits)
    np.testing.assert_allclose(grad, -auto.numpy(), rtol=0, atol=1e-13)
    assert abs(J + float(loss)) < 1e-13
    opt = torch.optim.SGD([logits], lr=2.0)
    for _ in range(30):
        opt.zero_grad()
        (-tb.expected_reward(logits, T, p0, GAMMA, reward)).backward()
        opt.step()
    fl = fused.policy_gradient_ascent(l0, T.numpy(), p0.numpy(), GAMMA, reward.numpy(), 2.0, 30)
    np.testing.assert_allclose(fl, logits.detach().numpy(), rtol=0, atol=1e-11)


def test_apt_particle_reward_by_hand():
    """Four points on a line, k = 2: the mean distance to the two nearest others, divided by the running mean of
    every distance seen (URLB's RMS from 0 with a 1e-4 pseudo-count), then log(c + .)."""
    x = torch.tensor([[0.0], [1.0], [3.0], [7.0]], dtype=torch.float64)
    # nearest two: 0 -> (1, 3); 1 -> (1, 2); 3 -> (2, 3); 7 -> (4, 6)
    d = torch.tensor([[1.0, 3.0], [1.0, 2.0], [2.0, 3.0], [4.0, 6.0]], dtype=torch.float64)
    torch.testing.assert_close(deep.knn_distances(x, 2), d, rtol=0, atol=0)
    torch.testing.assert_close(deep.apt_particle_reward(x, 2, 1.0), torch.log(1 + d.mean(1)), rtol=0, atol=1e-15)
    rms = deep.RunningMean()
    m1 = 22.0 / 8 * 8 / (1e-4 + 8)  # first update: mean 2.75 of 8 distances, pulled by the pseudo-count
    torch.testing.assert_close(
        deep.apt_particle_reward(x, 2, 1.0, rms), torch.log(1 + d.mean(1) / m1), rtol=0, atol=1e-14
    )
    assert rms.count == pytest.approx(8 + 1e-4) and rms.mean == pytest.approx(m1, abs=1e-15)
    m2 = m1 + (2 * 2.75 - m1) * 8 / (8 + 1e-4 + 8)  # the same batch scaled by 2: the mean of all 16 distances seen
    torch.testing.assert_close(
        deep.apt_particle_reward(2 * x, 2, 1.0, rms), torch.log(1 + 2 * d.mean(1) / m2), rtol=0, atol=1e-14
    )
    assert rms.mean == pytest.approx(2.75 * 1.5, rel=1e-5)
