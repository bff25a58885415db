"""Exact Hessian of the leaderbot objectives and the damped Newton solver.

* ``likelihoods.hessian`` (per-pair blocks + analytic penalty Hessian) equals the naive
  ``torch.autograd.functional.hessian`` of the objective and central finite differences of the autograd gradient,
  in float64, for every kind and covariance / tie family;
* ``local_pair_nll`` is the same per-pair NLL as ``pair_nll``;
* ``DampedNewton``: one step on a quadratic, damping on a non-convex start, bad settings fail clearly;
* standard errors via the fast Hessian equal the ones via the naive route.
"""

from __future__ import annotations

import pytest
import torch

from core.errors import ConfigError
from datamodules.arena import embedded_path, read_votes
from lightning_modules.leaderbot import LeaderbotLitModule
from lightning_modules.leaderbot import likelihoods as lk
from lightning_modules.leaderbot.fit import fit_lbfgs, fit_newton
from lightning_modules.leaderbot.newton import DampedNewton

CONFIGS = [
    ("bradley_terry", None, 0),
    ("bradley_terry", 2, 0),
    ("rao_kupper", None, 0),
    ("rao_kupper", 1, 2),
    ("davidson", None, 0),
    ("davidson", 0, 1),
    ("davidson", 2, 2),
]


@pytest.fixture(scope="module")
def small():
    """The pairs among the first 30 competitors of the bundled data (a few hundred pairs, all outcomes)."""
    votes = read_votes(embedded_path())
    pairs = torch.as_tensor(votes["pairs"])
    counts = torch.as_tensor(votes["counts"], dtype=torch.float64)
    keep = pairs.max(1).values < 30
    return pairs[keep], counts[keep], 30


def _point(layout: lk.Layout, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = 0.3 * torch.randn(layout.n_param, generator=g, dtype=torch.float64)
    b = layout.blocks()
    if "t" in b:
        w[b["t"]] = 0.05 + 0.25 * torch.rand(layout.m, generator=g, dtype=torch.float64)
    if layout.kind == "rao_kupper":  # away from the clipped |eta| < 1e-2 region (a kink)
        w[b["tie"]] = w[b["tie"]].abs() + 0.5
    return w


@pytest.mark.parametrize("constraint", [False, True])
@pytest.mark.parametrize(("kind", "k_cov", "k_tie"), CONFIGS)
def test_hessian_matches_naive_hessian(small, kind, k_cov, k_tie, constraint):
    pairs, counts, m = small
    layout = lk.Layout(kind, m, k_cov, k_tie)
    basis = lk.dct_basis(m, k_tie)
    w = _point(layout, 3)
    fast = lk.hessian(w, pairs, counts, layout, basis, counts.sum(), constraint)
    naive = torch.autograd.functional.hessian(
        lambda v: lk.objective(v, pairs, counts, layout, basis, counts.sum(), constraint), w
    )
    assert torch.allclose(fast, fast.T, rtol=0, atol=0)
    assert (fast - naive).abs().max() <= 1e-12 * naive.abs().max()


@pytest.mark.parametrize(
    ("kind", "k_cov", "k_tie"), [("davidson", 0, 1), ("rao_kupper", 1, 2), ("bradley_terry", 2, 0)]
)
def test_hessian_vs_finite_differences_of_gradient(small, kind, k_cov, k_tie):
    pairs, counts, m = small
    layout = lk.Layout(kind, m, k_cov, k_tie)
    basis = lk.dct_basis(m, k_tie)
    w = _point(layout, 5)

    def grad(v: torch.Tensor) -> torch.Tensor:
        v = v.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(lk.objective(v, pairs, counts, layout, basis, counts.sum(), True), v)
        return g

    h = lk.hessian(w, pairs, counts, layout, basis, counts.sum(), True)
    rng = torch.Generator().manual_seed(0)
    for name, sl in layout.blocks().items():
        if sl.stop == sl.start:
            continue
        for k in torch.randint(sl.start, sl.stop, (3,), generator=rng).tolist():
            e = torch.zeros_like(w)
            e[k] = 1e-5
            fd = (grad(w + e) - grad(w - e)) / 2e-5
            assert (h[:, k] - fd).abs().max() <= 1e-7 * max(1.0, float(fd.abs().max())), (name, k)


@pytest.mark.parametrize("k_cov", [None, 0, 1, 3])
def test_constraint_hessian_is_exact(k_cov):
    layout = lk.Layout("davidson", 7, k_cov, 1)
    w = torch.randn(layout.n_param, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ref = torch.func.hessian(lambda v: lk.constraint_penalty(v, layout))(w)
    assert torch.allclose(lk.constraint_hessian(w, layout), ref, rtol=1e-13, atol=1e-12)


@pytest.mark.parametrize(("kind", "k_cov", "k_tie"), CONFIGS)
def test_local_pair_nll_equals_pair_nll(small, kind, k_cov, k_tie):
    pairs, counts, m = small
    layout = lk.Layout(kind, m, k_cov, k_tie)
    basis = lk.dct_basis(m, k_tie)
    w = _point(layout, 9)
    idx = lk.local_index(layout, pairs)
    got = lk.local_pair_nll(w[idx], basis[pairs[:, 0]], basis[pairs[:, 1]], counts, layout)
    assert torch.allclose(got, lk.pair_nll(w, pairs, counts, layout, basis), rtol=1e-14, atol=0)


def test_newton_solves_a_quadratic_in_one_iteration_and_damps_a_saddle():
    a = torch.tensor([[3.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    b = torch.tensor([1.0, -1.0], dtype=torch.float64)
    x = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = DampedNewton([x], max_iter=10, damping=0.0)

    def closure():
        opt.zero_grad()
        loss = 0.5 * x @ a @ x - b @ x
        loss.backward()
        return loss

    opt.step(closure, lambda: a)
    assert torch.allclose(x.detach(), torch.linalg.solve(a, b), atol=1e-14)
    assert opt.state[x]["n_iter"] == 1 and opt.state[x]["converged"]
    # f = x0^4/4 - x0^2/2 + x1^2: indefinite Hessian at the start, minima at x0 = +-1
    y = torch.nn.Parameter(torch.tensor([0.1, 1.0], dtype=torch.float64))
    opt = DampedNewton([y], max_iter=50)

    def closure2():
        opt.zero_grad()
        loss = y[0] ** 4 / 4 - y[0] ** 2 / 2 + y[1] ** 2
        loss.backward()
        return loss

    def hess2():
        v = y.detach()
        return torch.tensor([[3 * v[0] ** 2 - 1, 0.0], [0.0, 2.0]], dtype=torch.float64)

    opt.step(closure2, hess2)
    assert opt.state[y]["converged"] and torch.allclose(y.detach(), torch.tensor([1.0, 0.0], dtype=torch.float64))


def test_newton_bad_settings_fail_clearly():
    x = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ConfigError, match="newton: max_iter=0"):
        DampedNewton([x], max_iter=0)
    assert DampedNewton([x]).param_groups[0]["lr"] == 1.0  # Lightning's LearningRateMonitor reads it
    with pytest.raises(ConfigError, match="needs hessian_closure"):
        DampedNewton([x]).step(lambda: torch.zeros(()))
    with pytest.raises(ConfigError, match="exactly one"):
        DampedNewton([x, torch.nn.Parameter(torch.zeros(1))])
    with pytest.raises(ConfigError, match="model.optimizer='adam'"):
        LeaderbotLitModule(optimizer="adam")
    with pytest.raises(ConfigError, match=r"model.newton has unknown keys \['history_size'\]"):
        LeaderbotLitModule(optimizer="newton", newton={"history_size": 10})


@pytest.fixture(scope="module")
def newton_fit(small):
    pairs, counts, m = small
    layout = lk.Layout("davidson", m, 0, 1)
    return layout, fit_newton(layout, pairs, counts)


def test_newton_fit_is_a_stationary_point_lower_than_lbfgs(small, newton_fit):
    """Newton reaches the minimum (gradient ~0, Hessian positive definite); 100 L-BFGS iterations get no lower."""
    pairs, counts, m = small
    layout, newton = newton_fit
    lbfgs = fit_lbfgs(layout, pairs, counts, max_steps=5)
    assert newton.converged and newton.loss <= lbfgs.loss + 1e-12
    w = newton.w.clone().requires_grad_(True)
    basis = lk.dct_basis(m, 1)
    (g,) = torch.autograd.grad(lk.objective(w, pairs, counts, layout, basis, counts.sum(), True), w)
    assert g.abs().max() < 1e-9
    assert torch.linalg.eigvalsh(lk.hessian(newton.w, pairs, counts, layout, basis, counts.sum(), True)).min() > 0


def test_standard_errors_fast_hessian_equal_naive_route(small, newton_fit):
    pairs, counts, m = small
    layout, newton = newton_fit
    model = LeaderbotLitModule(kind="davidson", k_cov=0, k_tie=1, plots=False)
    model.build([f"m{i}" for i in range(m)], pairs, counts)
    with torch.no_grad():
        model.w.copy_(newton.w / model.precond)  # at the MLE: the information is positive definite
    se = model.standard_errors_of_scores(pairs, counts)
    total = counts.sum()
    hess = total * torch.autograd.functional.hessian(
        lambda v: lk.objective(v, pairs, counts, layout, model.basis, total, True), model.params().detach()
    )
    ref = torch.diagonal(torch.linalg.inv(0.5 * (hess + hess.T)))[:m].sqrt()
    assert torch.isfinite(se).all() and torch.allclose(se, ref, rtol=1e-9, atol=0)
