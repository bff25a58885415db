"""The MaxEnt-optimal stationary distribution of a tabular MDP by convex optimisation (the reference of the paper).

``max_{d >= 0} H(sum_a d(., a))  s.t.  sum_a d(s, a) = (1 - gamma) p0(s) + gamma sum_{s',a'} T(s|s',a') d(s',a')``

is a concave maximisation over the Bellman-flow polytope (``cvxpy.entr``, exponential cone). The official code
solves it with MOSEK (licensed); the suite uses Clarabel, the open-source interior-point conic solver that ships
with cvxpy.
"""

from __future__ import annotations

import numpy as np
import torch

from core.errors import ConfigError


def maxent_optimal(
    T: torch.Tensor, p0: torch.Tensor, gamma: float, solver: str = "CLARABEL"
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The stationary distribution with maximal state entropy and a policy that induces it.

    Args:
        T: Transitions ``[S, A, S]``.
        p0: Initial distribution ``[S]``.
        gamma: Discount in (0, 1).
        solver: A cvxpy conic solver with exponential cones (``CLARABEL`` default, ``SCS``).

    Returns:
        ``(pi [S, A], d_s [S], H(d_s))``; ``pi(a|s) ∝ d(s, a)`` (uniform where the optimum puts no mass).
    """
    import cvxpy as cp

    S, A, _ = T.shape
    P = T.detach().cpu().numpy().reshape(S * A, S)
    q0 = p0.detach().cpu().numpy()
    d = cp.Variable(S * A, nonneg=True)
    B = np.kron(np.eye(S), np.ones((1, A)))  # [S, S*A]: sums d(s, .) over actions
    d_s = B @ d
    problem = cp.Problem(cp.Maximize(cp.sum(cp.entr(d_s))), [d_s == (1 - gamma) * q0 + gamma * (P.T @ d)])
    try:
        problem.solve(solver=solver)
    except cp.error.SolverError as err:
        raise ConfigError(f"maxent_optimal: solver {solver} failed ({err})") from None
    if problem.status not in ("optimal", "optimal_inaccurate") or d.value is None:
        raise ConfigError(f"maxent_optimal: solver {solver} returned status {problem.status}")
    dv = np.clip(d.value.reshape(S, A), 0.0, None)
    dv = dv / dv.sum()
    ds = dv.sum(1, keepdims=True)
    pi = np.where(ds > 1e-12, dv / np.maximum(ds, 1e-300), 1.0 / A)
    ds = ds[:, 0]
    h = float(-(ds[ds > 0] * np.log(ds[ds > 0])).sum())
    return torch.from_numpy(pi).to(T.dtype), torch.from_numpy(ds).to(T.dtype), h
