"""MDA's curve projection (``normalize_curve`` of the official code; paper Sec. 3.2, patch magnitude step).

Least-squares projection of a curve ``y`` ``[n]`` onto the convex (``kind=0``, deletion curves) or concave
(``kind=1``, insertion curves) sequences that keep both endpoints and stay in ``[0, 1]``::

    min_x ||x - y||^2   s.t.   0 <= x_i <= 1,   x_0 = y_0,   x_{n-1} = y_{n-1},
                               x_i - 2 x_{i+1} + x_{i+2} >= 0   (kind 0)   or   <= 0   (kind 1).

:func:`normalize_curve` solves it with cvxpy + Clarabel (the official code uses cvxopt's QP solver, which the suite
does not ship); :func:`normalize_curve_naive` is its twin, an independent SciPy SLSQP solve of the same QP, used by
the parity test. Endpoints outside ``[0, 1]`` make the problem infeasible and raise a clear error.
"""

from __future__ import annotations

import numpy as np

from core.errors import ConfigError


def _check(y: np.ndarray, kind: int) -> np.ndarray:
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if kind not in (0, 1):
        raise ConfigError(f"normalize_curve kind={kind} must be 0 (convex, deletion) or 1 (concave, insertion)")
    if y.size < 2 or not np.isfinite(y).all():
        raise ConfigError(f"normalize_curve needs >= 2 finite points, got {y.size} (finite: {np.isfinite(y).all()})")
    if not (0.0 <= y[0] <= 1.0 and 0.0 <= y[-1] <= 1.0):
        raise ConfigError(f"normalize_curve endpoints {y[0]:.4g}, {y[-1]:.4g} must lie in [0, 1]")
    return y


def second_difference(n: int) -> np.ndarray:
    """``D`` ``[n - 2, n]`` with ``(D x)_i = x_i - 2 x_{i+1} + x_{i+2}``."""
    d = np.zeros((max(n - 2, 0), n))
    i = np.arange(n - 2)
    d[i, i], d[i, i + 1], d[i, i + 2] = 1.0, -2.0, 1.0
    return d


def normalize_curve(y: np.ndarray, kind: int = 0) -> np.ndarray:
    """Convex (``kind=0``) / concave (``kind=1``) projection of ``y`` ``[n]`` with fixed ends and box ``[0, 1]``.

    Solved by cvxpy with the Clarabel interior-point solver (tight tolerances, then Clarabel's defaults, then the
    SLSQP twin :func:`normalize_curve_naive` if Clarabel fails numerically); the result is clipped to ``[0, 1]`` to
    remove the solver's ``1e-9``-level slack.
    """
    import cvxpy as cp

    y = _check(y, kind)
    n = y.size
    if n <= 2:
        return y.copy()
    x = cp.Variable(n)
    sign = 1.0 if kind == 0 else -1.0
    cons = [x >= 0, x <= 1, x[0] == y[0], x[n - 1] == y[n - 1], sign * (second_difference(n) @ x) >= 0]
    prob = cp.Problem(cp.Minimize(cp.sum_squares(x - y)), cons)
    # The QP is always feasible (the straight line between the ends is both convex and concave), so a failure is
    # numerical: Clarabel at tight tolerances stalls on some nearly flat curves. Retry at its default tolerances,
    # then fall back to the SLSQP twin rather than lose an image's scores.
    for opts in ({"tol_gap_abs": 1e-11, "tol_gap_rel": 1e-11, "tol_feas": 1e-11}, {}):
        try:
            prob.solve(solver=cp.CLARABEL, **opts)
        except cp.error.SolverError:
            continue
        if x.value is not None and prob.status in ("optimal", "optimal_inaccurate"):
            break
    else:
        return normalize_curve_naive(y, kind)
    out = np.clip(np.asarray(x.value, dtype=np.float64), 0.0, 1.0)
    out[0], out[-1] = y[0], y[-1]
    return out


def normalize_curve_naive(y: np.ndarray, kind: int = 0) -> np.ndarray:
    """Twin of :func:`normalize_curve`: the same QP by SciPy's SLSQP (independent solver, slow, for tests)."""
    from scipy.optimize import minimize

    y = _check(y, kind)
    n = y.size
    if n <= 2:
        return y.copy()
    d = second_difference(n) * (1.0 if kind == 0 else -1.0)
    x0 = np.linspace(y[0], y[-1], n)  # feasible: a line is both convex and concave
    cons = [
        {"type": "ineq", "fun": lambda x: d @ x, "jac": lambda x: d},
        {"type": "eq", "fun": lambda x: np.array([x[0] - y[0], x[-1] - y[-1]])},
    ]
    res = minimize(
        lambda x: float(((x - y) ** 2).sum()),
        x0,
        jac=lambda x: 2 * (x - y),
        bounds=[(0.0, 1.0)] * n,
        constraints=cons,
        method="SLSQP",
        options={"ftol": 1e-14, "maxiter": 1000},
    )
    out = np.clip(res.x, 0.0, 1.0)
    out[0], out[-1] = y[0], y[-1]
    return out
