"""Plain (Lightning-free) full-batch fits of a likelihood: used by the benchmark and the tests.

They run exactly what :class:`~lightning_modules.leaderbot.module.LeaderbotLitModule` runs per epoch (one
``optimizer.step`` of ``max_iter`` iterations) until a step reports convergence or ``max_steps``:
:func:`fit_newton` (damped Newton with the exact Hessian, the default solver) and :func:`fit_lbfgs`
(torch L-BFGS with a strong-Wolfe line search).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from lightning_modules.leaderbot import likelihoods as lk
from lightning_modules.leaderbot.newton import DampedNewton


@dataclass
class FitResult:
    w: torch.Tensor
    loss: float
    nll: float
    iterations: int
    seconds: float
    converged: bool


def lbfgs_converged(iterations: int, evals: int, opt: torch.optim.LBFGS) -> bool:
    """Whether an ``LBFGS.step`` returned because a tolerance was met (not because it spent ``max_iter``
    iterations or ``max_eval`` function evaluations)."""
    return iterations < opt.defaults["max_iter"] and evals < opt.defaults["max_eval"]


def fit_lbfgs(
    layout: lk.Layout,
    pairs: torch.Tensor,
    counts: torch.Tensor,
    w0: torch.Tensor | None = None,
    constraint: bool = True,
    max_iter: int = 20,
    max_steps: int = 200,
    max_eval: int | None = None,
    history_size: int = 50,
    tolerance_grad: float = 1e-10,
    tolerance_change: float = 1e-14,
    min_improvement: float = 1e-9,
    precondition: bool = True,
) -> FitResult:
    """Minimise :func:`~lightning_modules.leaderbot.likelihoods.objective` from ``w0`` (default: the package's
    initial point).

    Args:
        layout: Model layout.
        pairs: ``[n, 2]``; counts: ``[n, 3]``.
        w0: ``[n_param]`` starting point.
        constraint: Include the identifiability penalties.
        precondition: Optimise ``w / s`` with :func:`~lightning_modules.leaderbot.likelihoods.preconditioner`.
        min_improvement: Stop when one whole step lowers the objective by less than this (relative); needed
            because the MLE of a competitor that won (or lost) every game is at infinity.
        max_iter: L-BFGS iterations per step; max_steps: step cap; max_eval: loss evaluations per step
            (default ``2 * max_iter``).

    Returns:
        :class:`FitResult` (``nll`` is the unconstrained mean NLL at the solution).
    """
    t0 = time.perf_counter()
    max_eval = 2 * max_iter if max_eval is None else max_eval
    counts = counts.to(torch.float64)
    basis = lk.dct_basis(layout.m, layout.k_tie)
    total = counts.sum().clamp_min(1.0)
    w_init = (lk.initial_params(layout, pairs, counts) if w0 is None else w0).clone().double()
    scale = lk.preconditioner(layout, pairs, counts) if precondition else torch.ones_like(w_init)
    u = torch.nn.Parameter(w_init / scale)
    opt = torch.optim.LBFGS(
        [u],
        lr=1.0,
        max_iter=max_iter,
        max_eval=max_eval,
        history_size=history_size,
        tolerance_grad=tolerance_grad,
        tolerance_change=tolerance_change,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = lk.objective(u * scale, pairs, counts, layout, basis, total, constraint)
        loss.backward()
        return loss

    converged, iterations, prev = False, 0, float("inf")
    for _ in range(max_steps):
        before = (int(opt.state[u].get("n_iter", 0)), int(opt.state[u].get("func_evals", 0)))
        opt.step(closure)
        done = int(opt.state[u].get("n_iter", 0)) - before[0]
        evals = int(opt.state[u].get("func_evals", 0)) - before[1]
        iterations += done
        with torch.no_grad():
            loss = float(lk.objective(u * scale, pairs, counts, layout, basis, total, constraint))
        if lbfgs_converged(done, evals, opt) or prev - loss < min_improvement * max(1.0, abs(loss)):
            converged = True
            break
        prev = loss
    w = (u * scale).detach()
    with torch.no_grad():
        loss = float(lk.objective(w, pairs, counts, layout, basis, total, constraint))
        nll = float(lk.objective(w, pairs, counts, layout, basis, total, False))
    return FitResult(w, loss, nll, iterations, time.perf_counter() - t0, converged)


def fit_newton(
    layout: lk.Layout,
    pairs: torch.Tensor,
    counts: torch.Tensor,
    w0: torch.Tensor | None = None,
    constraint: bool = True,
    max_iter: int = 5,
    max_steps: int = 60,
    tolerance_grad: float = 1e-10,
    tolerance_change: float = 1e-15,
    precondition: bool = True,
) -> FitResult:
    """Minimise :func:`~lightning_modules.leaderbot.likelihoods.objective` with
    :class:`~lightning_modules.leaderbot.newton.DampedNewton` (exact Hessian) from ``w0`` (default: the
    package's initial point); ``max_steps`` steps of ``max_iter`` iterations at most.

    ``precondition`` optimises ``u = w / s`` as :func:`fit_lbfgs` does (Newton's direction does not depend on it;
    the Levenberg-Marquardt damping does).

    Returns:
        :class:`FitResult` (``iterations`` = Newton iterations, i.e. Hessian evaluations).
    """
    t0 = time.perf_counter()
    counts = counts.to(torch.float64)
    basis = lk.dct_basis(layout.m, layout.k_tie)
    total = counts.sum().clamp_min(1.0)
    w_init = (lk.initial_params(layout, pairs, counts) if w0 is None else w0).clone().double()
    scale = lk.preconditioner(layout, pairs, counts) if precondition else torch.ones_like(w_init)
    u = torch.nn.Parameter(w_init / scale)
    opt = DampedNewton([u], max_iter=max_iter, tolerance_grad=tolerance_grad, tolerance_change=tolerance_change)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = lk.objective(u * scale, pairs, counts, layout, basis, total, constraint)
        loss.backward()
        return loss

    def hessian_closure() -> torch.Tensor:
        h = lk.hessian((u * scale).detach(), pairs, counts, layout, basis, total, constraint)
        return scale[:, None] * h * scale[None, :]

    converged = False
    for _ in range(max_steps):
        opt.step(closure, hessian_closure)
        if opt.state[u]["converged"]:
            converged = True
            break
    w = (u * scale).detach()
    with torch.no_grad():
        loss = float(lk.objective(w, pairs, counts, layout, basis, total, constraint))
        nll = float(lk.objective(w, pairs, counts, layout, basis, total, False))
    return FitResult(w, loss, nll, int(opt.state[u]["n_iter"]), time.perf_counter() - t0, converged)
