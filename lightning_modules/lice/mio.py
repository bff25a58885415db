"""LiCE's mixed-integer optimisation (MIO) for likely counterfactual explanations, in Pyomo, solved by HiGHS.

One Pyomo model per factual ``x0`` (table form, see :mod:`datamodules.tabular`) encodes, following the paper:

* **Input encoding** (Sec. 4.1). Continuous: ``x = x0 + d+ - d-`` with ``d+- >= 0`` bounded by ``[0, 1]`` and by
  monotonicity (an ``increasing`` feature has ``d- = 0``), an exclusivity binary lets only one of them be nonzero,
  immutable features are constants, integer-valued features get an integer shadow ``x = k / (hi - lo)``. Binary: one
  binary variable. Categorical: one-hot binaries with ``sum_k o_k = 1``.
* **Distance** (Eq. (2)): ``sum_j cost_j |x_j - x0_j|`` with inverse-MAD costs ``cost_j = 1 / max(MAD_j, 1e-4)`` for
  continuous features and a unit cost per changed binary/categorical feature.
* **Classifier** (Sec. 4.2): a ReLU MLP ``z_l = ReLU(W_l z_{l-1} + b_l)`` in the big-M form
  ``z >= a, z >= 0, z <= a - L (1 - s), z <= U s`` (``s`` binary) with ``[L, U]`` from interval arithmetic on the
  input bounds; neurons with ``U <= 0`` are 0, with ``L >= 0`` linear. Validity: ``sign * logit >= 1e-4``.
* **SPN** (Sec. 4.3), every node value is a log-density, the label leaf is fixed to the desired class:
  histogram leaf (Eq. (5)): binaries ``nib_i`` ("not in bin i"), ``sum_i nib_i = B - 1``,
  ``M nib_i >= b_i - x``, ``M nib_i >= x - b_{i+1} + gap``, output ``sum_i (1 - nib_i) log rho_i`` (consecutive bins
  of equal density merged first); categorical/binary leaves are linear in the one-hot; a product node is the sum of
  its children (Eq. (6)); a sum node is the max-approximation (Eq. (7)): ``out <= l_c + log w_c + M_c s_c`` with
  binaries ``sum_c s_c = n - 1``.
* **Objective**: ``mio`` (distance only, the baseline), ``threshold`` (distance s.t. ``SPN(x') >= tau``, LiCE with
  the median training log-likelihood) or ``optimize`` (distance ``- alpha * SPN(x')``, Eq. (8)).

Deviations from the official code (documented in docs/methods/lice.md): the sum-node big-M is computed from interval
bounds of the node values (the official code uses 100, which is invalid when log-likelihoods span more than 100
nats); counterfactuals are snapped into the histogram bins the solver chose, so the reported LL is the one the MIO
optimised (the official 6-decimal rounding can land in the next bin).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyomo.environ as pyo

from core.errors import ConfigError
from lightning_modules.lice.spn import SPN, CategoricalLeaf, HistogramLeaf, ProductNode, SumNode, histogram_bin

OBJECTIVES = ("mio", "threshold", "optimize")
SUM_APPROX = ("lower", "upper")
BACKENDS = ("highspy", "pyomo")
HIGHS_OPTIONS = {"mip_feasibility_tolerance": 1e-7, "primal_feasibility_tolerance": 1e-7}

# HiGHS's console output, as appsi captures it. appsi runs every call under pyomo's ``capture_output`` (the process's
# stdout/stderr redirected into pipes that one reader thread drains into a ``LogStream``). Were the records to reach
# the root logger's handlers, a handler that fails (a stream closed under it: a finished run's console, a test's
# captured output) would print its ``--- Logging error ---`` traceback into those same pipes from that reader
# thread: every line read writes a traceback of many lines back, the pipe fills, the reader blocks on its own pipe
# and the main thread waits on it for ever in ``TeeStream.close``. So the output goes to a logger of its own that
# never propagates: what HiGHS prints reaches no handler the suite did not put there.
SOLVER_LOG = logging.getLogger("lightning_modules.lice.highs_output")
SOLVER_LOG.propagate = False
SOLVER_LOG.addHandler(logging.NullHandler())


def appsi_highs() -> Any:
    """Pyomo's ``appsi`` HiGHS solver with its output on :data:`SOLVER_LOG` (at DEBUG), not echoed to the console."""
    from pyomo.contrib.appsi.solvers import Highs

    solver = Highs()
    solver.config.stream_solver = False
    solver.config.log_level = logging.DEBUG  # HiGHS's log goes to DEBUG, not the run's INFO log
    solver.config.solver_output_logger = SOLVER_LOG
    return solver


@dataclass
class CounterfactualResult:
    """Outcome of one counterfactual search.

    Attributes:
        status: ``optimal``; ``time_limit`` (a feasible, not proven optimal CE); ``infeasible`` (no
            counterfactual exists under the constraints, e.g. immutable features make the class unreachable);
            ``time_limit_no_solution``; ``not_found`` (heuristics); ``error: <reason>`` (solver failure, reported
            not raised).
        x: Counterfactual in table form ``[F]`` or ``None``.
        objective: Solver objective or ``None``.
        spn_value: The MIO's root SPN value (max-approximation) or ``None``.
        seconds: Wall time of the solve.
    """

    status: str
    x: np.ndarray | None = None
    objective: float | None = None
    spn_value: float | None = None
    seconds: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def found(self) -> bool:
        return self.x is not None


def mlp_forward(layers: Sequence[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> np.ndarray:
    """Logits ``[N]`` of a ReLU MLP given as ``[(W [out, in], b [out]), ...]`` on inputs ``[N, D]``."""
    h = np.atleast_2d(x)
    for i, (w, b) in enumerate(layers):
        h = h @ w.T + b
        if i < len(layers) - 1:
            h = np.maximum(h, 0.0)
    return h[:, 0]


def interval_bounds(
    layers: Sequence[tuple[np.ndarray, np.ndarray]], lo: np.ndarray, hi: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Pre-activation bounds ``[(L_l, U_l)]`` of every layer by interval arithmetic from inputs in ``[lo, hi]``."""
    out = []
    for i, (w, b) in enumerate(layers):
        wp, wn = np.maximum(w, 0.0), np.minimum(w, 0.0)
        low, up = wp @ lo + wn @ hi + b, wp @ hi + wn @ lo + b
        out.append((low, up))
        if i < len(layers) - 1:
            lo, hi = np.maximum(low, 0.0), np.maximum(up, 0.0)
    return out


def feature_costs(features: Sequence[Any], train_table: np.ndarray, mad_floor: float = 1e-4) -> np.ndarray:
    """Per-feature distance weights: ``1 / max(MAD_j, mad_floor)`` for continuous features, 1 otherwise."""
    costs = np.ones(len(features))
    for j, f in enumerate(features):
        if f.kind == "continuous":
            col = train_table[:, j]
            costs[j] = 1.0 / max(float(np.median(np.abs(col - np.median(col)))), mad_floor)
    return costs


def inverse_mad_l1(x: np.ndarray, x_cf: np.ndarray, mads: np.ndarray) -> float:
    """``sum_j |x_cf_j - x_j| / mad_j`` over continuous features (Eq. (2))."""
    return float(np.sum(np.abs(np.asarray(x_cf) - np.asarray(x)) / np.asarray(mads)))


def distance(x: np.ndarray, x_cf: np.ndarray, features: Sequence[Any], costs: np.ndarray) -> float:
    """The MIO's distance of a table-form counterfactual: weighted L1 (continuous) + cost per changed discrete."""
    total = 0.0
    for j, f in enumerate(features):
        if f.kind == "continuous":
            total += costs[j] * abs(float(x_cf[j]) - float(x[j]))
        else:
            total += costs[j] * float(round(float(x_cf[j])) != round(float(x[j])))
    return total


def sparsity(x: np.ndarray, x_cf: np.ndarray, features: Sequence[Any], tol: float = 1e-6) -> int:
    """Number of changed features."""
    return int(
        sum(
            abs(float(x_cf[j]) - float(x[j])) > (tol if f.kind == "continuous" else 0.5) for j, f in enumerate(features)
        )
    )


class LiceMIO:
    """Builds and solves the LiCE MIO for single factuals (see the module docstring for the encoding).

    Args:
        features: Feature specs (``kind``, ``immutable``, ``monotone``, ``discrete``, ``n_categories``, ``step``).
        layers: The classifier as ``[(W, b), ...]`` (float64), acting on the one-hot encoding; last layer 1 output.
        costs: ``[F]`` distance weights (:func:`feature_costs`).
        spn: SPN over ``F + 1`` variables (features then label) or ``None`` (plain MIO).
        objective: ``mio`` | ``threshold`` | ``optimize``.
        threshold: ``tau`` of the threshold variant.
        alpha: Weight of the SPN value in the optimise variant.
        time_limit: Solver limit in seconds.
        bin_gap: Upper-bin gap of the histogram-leaf encoding (normalised units): bin ``i < B - 1`` holds
            ``b_i <= x <= b_{i+1} - bin_gap``, so a CE in a lower bin ends ``bin_gap`` below its break. Default 1e-6,
            the official ``MIO_EPS`` (solver feasibility tolerances stay 1e-7 = ``MIO_EPS / 10`` as in the official
            Gurobi settings); a larger gap only makes every objective slightly worse (1e-4 puts a GMSC income 5 raw
            units below a break instead of 0.05).
        margin: Classifier margin on the logit.
        sum_approx: ``lower`` (``log w_c``, the max lower bound) or ``upper`` (``min(0, log(n w_c))``).
        backend: How the plain MIO (``objective="mio"``) reaches HiGHS: ``highspy`` (default) assembles the same
            constraints as a sparse matrix in numpy and passes it to ``highspy`` directly (:meth:`matrix_model`);
            ``pyomo`` builds the Pyomo model and lets ``appsi_highs`` translate it (the naive twin, as the
            official code does). Same MIO, same HiGHS options; the Pyomo model build and appsi's translation cost
            about as much as the HiGHS solve of a plain MIO (benchmarks/lice_mio_speed.py). The SPN variants always
            use Pyomo.
    """

    def __init__(
        self,
        features: Sequence[Any],
        layers: Sequence[tuple[np.ndarray, np.ndarray]],
        costs: np.ndarray,
        spn: SPN | None = None,
        objective: str = "mio",
        threshold: float | None = None,
        alpha: float = 0.1,
        time_limit: float = 60.0,
        bin_gap: float = 1e-6,
        margin: float = 1e-4,
        sum_approx: str = "lower",
        backend: str = "highspy",
    ) -> None:
        if objective not in OBJECTIVES:
            raise ConfigError(f"objective={objective!r} must be one of {list(OBJECTIVES)}")
        if objective != "mio" and spn is None:
            raise ConfigError(f"objective={objective!r} needs an SPN")
        if objective == "threshold" and threshold is None:
            raise ConfigError("objective='threshold' needs a threshold")
        if time_limit <= 0:
            raise ConfigError(f"model.time_limit={time_limit} must be > 0")
        if alpha < 0:
            raise ConfigError(f"model.alpha={alpha} must be >= 0")
        if not 0 < bin_gap < 0.5:
            raise ConfigError(f"model.bin_gap={bin_gap} must be in (0, 0.5) (normalised units)")
        if sum_approx not in SUM_APPROX:
            raise ConfigError(f"model.sum_approx={sum_approx!r} must be one of {list(SUM_APPROX)}")
        if backend not in BACKENDS:
            raise ConfigError(f"model.mio_backend={backend!r} must be one of {list(BACKENDS)}")
        self.features, self.layers, self.costs = list(features), list(layers), np.asarray(costs, np.float64)
        self.spn, self.objective, self.threshold, self.alpha = spn, objective, threshold, alpha
        self.time_limit, self.bin_gap, self.margin, self.sum_approx = time_limit, bin_gap, margin, sum_approx
        self.backend, self.highs_options = backend, dict(HIGHS_OPTIONS)

    # -- model building ---------------------------------------------------------------------------------------------
    def build(
        self,
        x0: np.ndarray,
        desired: int,
        use_classifier: bool = True,
        use_spn: bool | None = None,
        fix_x: np.ndarray | None = None,
    ) -> pyo.ConcreteModel:
        """The Pyomo model for factual ``x0`` ``[F]`` and target class ``desired``.

        ``use_classifier=False`` drops the validity constraint; ``use_spn`` overrides whether the SPN is encoded;
        ``fix_x`` ``[F]`` pins the counterfactual to a point (then the objective maximises the SPN value: the MIO's
        root equals the max-approximation, the parity check).
        """
        x0 = np.asarray(x0, np.float64)
        use_spn = (self.objective != "mio") if use_spn is None else use_spn
        m = pyo.ConcreteModel()
        m.cons = pyo.ConstraintList()
        m.nib_records = []  # (variable, merged breaks, nib binaries) of every encoded histogram leaf
        values, inputs, in_lo, in_hi, dist_terms = [], [], [], [], []
        for j, f in enumerate(self.features):
            value, cols, lo, hi, dist = self._encode_feature(m, j, f, x0[j], None if fix_x is None else fix_x[j])
            values.append(value)
            inputs += cols
            in_lo += lo
            in_hi += hi
            dist_terms.append(dist)
        m.values = values
        m.distance = pyo.Expression(expr=sum(dist_terms))
        if use_classifier:
            m.logit = pyo.Expression(expr=self._encode_mlp(m, inputs, np.array(in_lo), np.array(in_hi)))
            sign = 1.0 if desired == 1 else -1.0
            m.validity = pyo.Constraint(expr=sign * m.logit >= self.margin)
        root = None
        if use_spn and self.spn is not None:
            m.spn_root = pyo.Expression(expr=self._encode_spn(m, values, desired))
            root = m.spn_root
        if fix_x is not None:
            m.obj = pyo.Objective(expr=-(root if root is not None else 0.0), sense=pyo.minimize)
        elif self.objective == "threshold" and root is not None:
            m.cons.add(root >= float(self.threshold))
            m.obj = pyo.Objective(expr=m.distance, sense=pyo.minimize)
        elif self.objective == "optimize" and root is not None:
            m.obj = pyo.Objective(expr=m.distance - self.alpha * root, sense=pyo.minimize)
        else:
            m.obj = pyo.Objective(expr=m.distance, sense=pyo.minimize)
        return m

    def _encode_feature(self, m: pyo.ConcreteModel, j: int, f: Any, x0: float, fixed: float | None) -> tuple:
        """Returns (table value: expr | list of one-hot exprs, classifier input exprs, their lower/upper bounds,
        distance expr)."""
        blk = pyo.Block()
        m.add_component(f"f{j}", blk)
        if f.kind == "continuous":
            if f.immutable:
                return x0, [x0], [x0], [x0], 0.0
            up = 0.0 if f.monotone == "decreasing" else max(1.0 - x0, 0.0)
            down = 0.0 if f.monotone == "increasing" else max(x0, 0.0)
            blk.dp = pyo.Var(bounds=(0.0, up))
            blk.dm = pyo.Var(bounds=(0.0, down))
            if up > 0 and down > 0:  # exclusivity: only one direction changes
                blk.e = pyo.Var(domain=pyo.Binary)
                blk.c_up = pyo.Constraint(expr=blk.dp <= up * blk.e)
                blk.c_down = pyo.Constraint(expr=blk.dm <= down * (1 - blk.e))
            x = x0 + blk.dp - blk.dm
            if f.discrete and f.step < 1.0:
                k0 = round(x0 / f.step)
                blk.k = pyo.Var(domain=pyo.Integers, bounds=(k0 - round(down / f.step), k0 + round(up / f.step)))
                blk.c_grid = pyo.Constraint(expr=x == blk.k * f.step)
            if fixed is not None:
                blk.c_fix = pyo.Constraint(expr=x == float(fixed))
            return x, [x], [x0 - down], [x0 + up], self.costs[j] * (blk.dp + blk.dm)
        if f.kind == "binary":
            if f.immutable:
                return x0, [x0], [x0], [x0], 0.0
            lo = x0 if f.monotone == "increasing" else 0.0
            hi = x0 if f.monotone == "decreasing" else 1.0
            blk.b = pyo.Var(domain=pyo.Binary, bounds=(lo, hi))
            if fixed is not None:
                blk.b.fix(round(float(fixed)))
            change = blk.b if round(x0) == 0 else 1 - blk.b
            return blk.b, [blk.b], [lo], [hi], self.costs[j] * change
        k = f.n_categories
        c0 = int(round(x0))
        if f.immutable:
            onehot = [float(i == c0) for i in range(k)]
            return onehot, onehot, onehot, onehot, 0.0
        allowed = [
            i
            for i in range(k)
            if not (f.monotone == "increasing" and i < c0) and not (f.monotone == "decreasing" and i > c0)
        ]
        blk.o = pyo.Var(range(k), domain=pyo.Binary)
        for i in range(k):
            if i not in allowed:
                blk.o[i].fix(0)
        blk.c_one = pyo.Constraint(expr=sum(blk.o[i] for i in range(k)) == 1)
        if fixed is not None:
            for i in range(k):
                blk.o[i].fix(int(i == round(float(fixed))))
        onehot = [blk.o[i] for i in range(k)]
        return onehot, onehot, [0.0] * k, [float(i in allowed) for i in range(k)], self.costs[j] * (1 - blk.o[c0])

    def _encode_mlp(self, m: pyo.ConcreteModel, inputs: list[Any], lo: np.ndarray, hi: np.ndarray) -> Any:
        """Big-M ReLU encoding of the MLP; returns the logit expression."""
        bounds = interval_bounds(self.layers, lo, hi)
        h = inputs
        m.relu = pyo.Block()
        for li, ((w, b), (low, up)) in enumerate(zip(self.layers, bounds)):
            pre = [
                sum(float(w[o, i]) * h[i] for i in range(w.shape[1]) if w[o, i] != 0.0) + float(b[o])
                for o in range(w.shape[0])
            ]
            if li == len(self.layers) - 1:
                return pre[0]
            out = []
            for o in range(w.shape[0]):
                if up[o] <= 0:
                    out.append(0.0)
                elif low[o] >= 0:
                    out.append(pre[o])
                else:
                    z = pyo.Var(bounds=(0.0, float(up[o])))
                    s = pyo.Var(domain=pyo.Binary)
                    m.relu.add_component(f"z{li}_{o}", z)
                    m.relu.add_component(f"s{li}_{o}", s)
                    m.cons.add(z >= pre[o])
                    m.cons.add(z <= pre[o] - float(low[o]) * (1 - s))
                    m.cons.add(z <= float(up[o]) * s)
                    out.append(z)
            h = out
        raise AssertionError("unreachable")

    def _encode_spn(self, m: pyo.ConcreteModel, values: list[Any], desired: int) -> Any:
        """SPN encoding; returns the root's log-value expression (max-approximation)."""
        spn = self.spn
        assert spn is not None
        n_feat = len(self.features)
        bounds = spn.node_bounds()
        m.spn = pyo.Block()
        out: list[Any] = []
        for node in spn.nodes:
            if isinstance(node, (HistogramLeaf, CategoricalLeaf)):
                v = node.scope[0]
                value = float(desired) if v == n_feat else values[v]
                out.append(self._encode_leaf(m, node, value))
            elif isinstance(node, ProductNode):
                out.append(sum(out[c.id] for c in node.children))  # Eq. (6)
            else:
                assert isinstance(node, SumNode)
                n = len(node.children)
                logw = np.log(node.weights)
                if self.sum_approx == "upper":
                    logw = np.minimum(0.0, np.log(node.weights * n))
                hi = max(bounds[c.id][1] + lw for c, lw in zip(node.children, logw))
                y = pyo.Var(bounds=(None, float(hi)))
                s = pyo.Var(range(n), domain=pyo.Binary)
                m.spn.add_component(f"sum{node.id}", y)
                m.spn.add_component(f"slack{node.id}", s)
                m.cons.add(sum(s[c] for c in range(n)) == n - 1)
                for ci, (c, lw) in enumerate(zip(node.children, logw)):
                    big_m = hi - (bounds[c.id][0] + lw)  # valid: out <= hi and l_c >= lower bound of c
                    m.cons.add(y <= out[c.id] + float(lw) + float(big_m) * s[ci])  # Eq. (7)
                out.append(y)
        return out[spn.root.id]

    def _encode_leaf(self, m: pyo.ConcreteModel, leaf: Any, value: Any) -> Any:
        if isinstance(leaf, CategoricalLeaf):
            logs = np.log(leaf.probs)
            if isinstance(value, list):  # categorical one-hot
                return sum(float(lp) * o for lp, o in zip(logs, value))
            if isinstance(value, (int, float)):
                return float(logs[int(round(value))])
            return float(logs[0]) * (1 - value) + float(logs[1]) * value
        if isinstance(value, (int, float)):  # immutable feature: constant
            return float(np.log(leaf.densities[histogram_bin(leaf.breaks, np.array([value]))[0]]))
        breaks, dens = merge_equal_bins(leaf.breaks, leaf.densities)
        if len(dens) == 1:
            return float(np.log(dens[0]))
        nb = len(dens)
        big_m = max(1.0, float(breaks[-1] - breaks[0]))
        nib = pyo.Var(range(nb), domain=pyo.Binary)
        m.spn.add_component(f"nib{leaf.id}", nib)
        m.cons.add(sum(nib[i] for i in range(nb)) == nb - 1)
        for i in range(nb):  # Eq. (5): x in bin i unless nib_i = 1
            if i > 0:
                m.cons.add(big_m * nib[i] >= float(breaks[i]) - value)
            if i < nb - 1:
                m.cons.add(big_m * nib[i] >= value - float(breaks[i + 1]) + self.bin_gap)
        m.nib_records.append((leaf.scope[0], breaks, [nib[i] for i in range(nb)]))
        return sum(float(np.log(dens[i])) * (1 - nib[i]) for i in range(nb))

    # -- solving ----------------------------------------------------------------------------------------------------
    def solve_model(self, m: pyo.ConcreteModel, warm_start: bool = False) -> tuple[str, float | None, float]:
        """Solve with HiGHS (``appsi_highs``); returns ``(status, objective, seconds)`` and loads the solution.

        ``warm_start`` hands the current values of ``m``'s variables to HiGHS as a MIP start (see :meth:`generate`).
        """
        from pyomo.contrib.appsi.base import TerminationCondition as TC

        solver = appsi_highs()
        solver.config.time_limit = float(self.time_limit)
        solver.config.load_solution = False
        solver.config.warmstart = warm_start
        solver.highs_options = dict(self.highs_options)
        start = time.perf_counter()
        try:
            res = solver.solve(m)
        except Exception as err:  # noqa: BLE001 - a solver failure is a result, not a crash
            return f"error: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}", None, 0.0
        seconds = time.perf_counter() - start
        tc = res.termination_condition
        if tc == TC.optimal:
            res.solution_loader.load_vars()
            return "optimal", float(res.best_feasible_objective), seconds
        if tc in (TC.infeasible, TC.infeasibleOrUnbounded):
            return "infeasible", None, seconds
        if tc == TC.maxTimeLimit:
            if res.best_feasible_objective is not None and np.isfinite(res.best_feasible_objective):
                res.solution_loader.load_vars()
                return "time_limit", float(res.best_feasible_objective), seconds
            return "time_limit_no_solution", None, seconds
        return f"error: termination {tc.name}", None, seconds

    def decode(self, m: pyo.ConcreteModel) -> np.ndarray:
        """Table-form counterfactual ``[F]`` from a solved model, snapped into the histogram bins the solver chose."""
        x = np.empty(len(self.features))
        for j, (f, v) in enumerate(zip(self.features, m.values)):
            if f.kind == "categorical":
                x[j] = float(np.argmax([pyo.value(o) for o in v]))
            elif f.kind == "binary":
                x[j] = float(round(pyo.value(v)))
            else:
                x[j] = float(pyo.value(v))
        lo, hi = np.zeros(len(x)), np.ones(len(x))
        for var, breaks, nib in m.nib_records:
            i = int(np.argmin([pyo.value(n) for n in nib]))
            lo[var] = max(lo[var], breaks[i])
            hi[var] = min(hi[var], breaks[i + 1] - (self.bin_gap if i < len(nib) - 1 else 0.0))
        return self._snap(x, lo, hi)

    def _snap(self, x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Clip the mutable continuous values of ``x`` into ``[lo, hi]`` and onto their integer grid."""
        for j, f in enumerate(self.features):
            if f.kind != "continuous" or f.immutable:
                continue
            x[j] = float(np.clip(x[j], lo[j], hi[j]))
            if f.discrete and f.step < 1.0:
                k = np.clip(round(x[j] / f.step), np.ceil(lo[j] / f.step - 1e-9), np.floor(hi[j] / f.step + 1e-9))
                x[j] = float(k * f.step)
        return x

    def generate(self, x0: np.ndarray, desired: int, start: np.ndarray | None = None) -> CounterfactualResult:
        """One counterfactual for factual ``x0`` ``[F]`` toward class ``desired``; never raises on solver trouble.

        ``start`` ``[F]``: a valid counterfactual (the plain MIO's) handed to HiGHS as a MIP start for the optimise
        objective, where every valid CE is feasible. Its variables are completed by a solve of the model with ``x``
        pinned to ``start``; ``info["start_objective"]`` is its LiCE objective, which the result never exceeds.
        Without it, a solve stopped by the time limit returns whatever incumbent HiGHS's heuristics found first,
        which can be orders of magnitude worse than the optimum (docs/results/lice_notes.md). Ignored for the other
        objectives (a MIO CE need not reach the threshold).
        """
        if self.backend == "highspy" and self.objective == "mio":
            return self.solve_matrix(x0, desired)
        m = self.build(x0, desired)
        start_objective, start_seconds = None, 0.0
        if start is not None and self.objective == "optimize" and self.spn is not None:
            start_objective, start_seconds = self._load_start(m, x0, desired, np.asarray(start, np.float64))
        status, objective, seconds = self.solve_model(m, warm_start=start_objective is not None)
        seconds += start_seconds
        info = {} if start_objective is None else {"start_objective": start_objective}
        if objective is None:
            return CounterfactualResult(status, seconds=seconds, info=info)
        root = m.component("spn_root")
        spn_value = float(pyo.value(root)) if root is not None else None
        return CounterfactualResult(status, self.decode(m), objective, spn_value, seconds, info)

    # -- the plain MIO in matrix form (backend="highspy") -------------------------------------------------------------
    def matrix_model(
        self, x0: np.ndarray, desired: int, bounds: list[tuple[np.ndarray, np.ndarray]] | None = None
    ) -> dict[str, Any]:
        """The plain MIO of :meth:`build` (``objective="mio"``, classifier on, no SPN) as numpy arrays.

        The LP that appsi's ``Highs.set_instance`` makes of :meth:`build`'s Pyomo model (tested): the same rows in
        the same order and orientation (the ReLU rows, the validity row, then the input-encoding rows), the columns
        in order of first appearance (:meth:`highs_lp` applies ``order``), fixed one-hots as empty columns, and the
        coefficients and constants summed in the order Pyomo sums them. The result is bitwise appsi's LP on the
        German and GMSC-shaped benchmark factuals; elsewhere a row bound can differ by an ulp (Pyomo's summation
        order of constants depends on the expression's structure). So HiGHS does the same work on both paths and
        the matrix path saves the Pyomo build and the translation. Every affine expression is a dense coefficient
        row over all columns plus a constant; the number of columns is known before the rows are written (the
        unstable ReLUs follow from the interval bounds of the input box; ``bounds`` overrides them).

        Returns a dict with ``cost`` / ``lb`` / ``ub`` / ``integer`` ``[n]``, the row-wise matrix ``a`` ``[r, n]``
        with ``row_lo`` / ``row_hi`` ``[r]``, the column ``order``, the objective ``offset``, the layer ``bounds``,
        the pre-activations ``pre`` (``[(coef [out, n], const [out])]``) and ``x_expr`` (per feature:
        ``([(column, coef)], const)`` of its table value, a one-hot list of those for categoricals, or a float if
        immutable).
        """
        x0 = np.asarray(x0, np.float64)
        lb: list[float] = []
        ub: list[float] = []
        integer: list[bool] = []
        cost: list[float] = []

        def col(lo: float, hi: float, is_int: bool = False, c: float = 0.0) -> int:
            lb.append(lo)
            ub.append(hi)
            integer.append(is_int)
            cost.append(c)
            return len(lb) - 1

        # pass 1: the feature columns, the classifier inputs as lists of (column, coefficient) plus a constant
        offset = 0.0
        inputs: list[tuple[list[tuple[int, float]], float]] = []
        in_lo: list[float] = []
        in_hi: list[float] = []
        x_expr: list[Any] = []
        fixed: list[int] = []
        rows: list[tuple[list[tuple[int, float]], float, float]] = []  # (terms, lo, hi)
        for j, f in enumerate(self.features):
            v = float(x0[j])
            categorical = f.kind not in ("continuous", "binary")
            if f.immutable:  # constants: the value itself, or the one-hot of the category
                vals = [float(i == round(v)) for i in range(f.n_categories)] if categorical else [v]
                inputs += [([], a) for a in vals]
                in_lo += vals
                in_hi += vals
                x_expr.append(vals if categorical else v)
                continue
            if f.kind == "continuous":
                up = 0.0 if f.monotone == "decreasing" else max(1.0 - v, 0.0)
                down = 0.0 if f.monotone == "increasing" else max(v, 0.0)
                dp = col(0.0, up, c=float(self.costs[j]))
                dm = col(0.0, down, c=float(self.costs[j]))
                if up > 0 and down > 0:
                    e = col(0.0, 1.0, True)
                    rows.append(([(dp, 1.0), (e, -up)], -np.inf, 0.0))  # dp <= up e
                    rows.append(([(dm, 1.0), (e, down)], -np.inf, down))  # dm <= down (1 - e)
                if f.discrete and f.step < 1.0:
                    k0 = round(v / f.step)
                    k = col(float(k0 - round(down / f.step)), float(k0 + round(up / f.step)), True)
                    rows.append(([(dp, 1.0), (dm, -1.0), (k, -f.step)], -v, -v))  # x0 + dp - dm = k step
                terms = [(dp, 1.0), (dm, -1.0)]
                inputs.append((terms, v))
                in_lo.append(v - down)
                in_hi.append(v + up)
                x_expr.append((terms, v))
            elif f.kind == "binary":
                lo = v if f.monotone == "increasing" else 0.0
                hi = v if f.monotone == "decreasing" else 1.0
                changed_if_one = round(v) == 0
                b = col(lo, hi, True, float(self.costs[j]) * (1.0 if changed_if_one else -1.0))
                offset += 0.0 if changed_if_one else float(self.costs[j])
                inputs.append(([(b, 1.0)], 0.0))
                in_lo.append(lo)
                in_hi.append(hi)
                x_expr.append(([(b, 1.0)], 0.0))
            else:
                kk, c0 = f.n_categories, int(round(v))
                allowed = [
                    i
                    for i in range(kk)
                    if not (f.monotone == "increasing" and i < c0) and not (f.monotone == "decreasing" and i > c0)
                ]
                os_ = [
                    col(0.0, float(i in allowed), True, -float(self.costs[j]) if i == c0 else 0.0) for i in range(kk)
                ]
                offset += float(self.costs[j])  # cost (1 - o_c0)
                fixed += [o for i, o in enumerate(os_) if i not in allowed]  # Pyomo fixes them to 0
                rows.append(([(o, 1.0) for o in os_], 1.0, 1.0))  # sum_k o_k = 1
                inputs += [([(o, 1.0)], 0.0) for o in os_]
                in_lo += [0.0] * kk
                in_hi += [float(i in allowed) for i in range(kk)]
                x_expr.append([([(o, 1.0)], 0.0) for o in os_])
        if bounds is None:
            bounds = interval_bounds(self.layers, np.array(in_lo), np.array(in_hi))
        n_unstable = sum(int(np.sum((up > 0) & (low < 0))) for low, up in bounds[:-1])
        n = len(lb) + 2 * n_unstable

        def dense(terms: list[tuple[int, float]]) -> np.ndarray:
            out = np.zeros(n)
            for c, a in terms:
                out[c] += a
            return out

        # pass 2: the classifier as dense affine maps h = H @ v + h0 over all n columns; the ReLU rows come first and
        # the input-encoding rows last, as in the LP that appsi makes of the Pyomo model (see below)
        h = np.stack([dense(t) for t, _ in inputs])
        # constants as Pyomo sums them, so the row bounds are bitwise those of the Pyomo path: per value, its constant
        # leaves as (weights above the leaf, bottom first; leaf value), the leaves summed in expression order and each
        # leaf's weights multiplied top-down into it (the weight times an immutable input is a float product)
        h0: list[list[tuple[tuple[float, ...], float]]] = [
            [((), c)] if c != 0.0 or not terms else [] for terms, c in inputs
        ]
        immutable = [not terms for terms, _ in inputs]
        extra: list[np.ndarray] = []
        extra_lo: list[float] = []
        extra_hi: list[float] = []
        pres = []
        for li, ((w, b), (low, up)) in enumerate(zip(self.layers, bounds)):
            pre, pre0 = np.zeros((w.shape[0], n)), np.zeros(w.shape[0])
            for i in range(w.shape[1]):  # summed term by term in input order, as Pyomo does (same rounding)
                pre += w[:, i : i + 1] * h[i]
                for chain, leaf in h0[i]:
                    mult = w[:, i].copy()
                    for f in reversed(chain):
                        mult = mult * f
                    pre0 += mult * leaf
            pre0 += b
            pres.append((pre, pre0))
            if li == len(self.layers) - 1:
                sign = 1.0 if desired == 1 else -1.0
                extra.append(sign * pre[:1])  # sign * logit >= margin
                extra_lo.append(self.margin - sign * float(pre0[0]))
                extra_hi.append(np.inf)
                break
            new_h = np.zeros_like(pre)
            new_h0: list[list[tuple[tuple[float, ...], float]]] = [[] for _ in range(w.shape[0])]
            for o in range(w.shape[0]):
                if up[o] <= 0:
                    continue
                if low[o] >= 0:
                    new_h[o] = pre[o]
                    for i in range(w.shape[1]):
                        for chain, leaf in h0[i]:
                            if li == 0 and immutable[i]:  # w * float: Python multiplies it at once
                                new_h0[o].append(((), float(w[o, i]) * leaf))
                            else:
                                new_h0[o].append(((*chain, float(w[o, i])), leaf))
                    new_h0[o].append(((), float(b[o])))
                    continue
                z, s = col(0.0, float(up[o])), col(0.0, 1.0, True)
                block = np.tile(-pre[o], (3, 1))
                block[0] = pre[o]
                block[0, z] -= 1.0
                block[1, z] += 1.0
                block[1, s] -= float(low[o])
                block[2] = 0.0
                block[2, z], block[2, s] = 1.0, -float(up[o])
                extra.append(block)  # pre - z <= 0 (z >= pre); z <= pre - L (1 - s); z <= U s
                extra_lo += [-np.inf, -np.inf, -np.inf]
                extra_hi += [-float(pre0[o]), float(pre0[o] - low[o]), 0.0]
                new_h[o, z] = 1.0
            h, h0 = new_h, new_h0
        assert len(lb) == n
        if rows:
            extra.append(np.stack([dense(t) for t, _, _ in rows]))
            extra_lo += [r[1] for r in rows]
            extra_hi += [r[2] for r in rows]
        a = np.concatenate(extra)
        # columns in order of first appearance in the rows, then the objective-only ones: the order appsi gives them
        nz_c = np.nonzero(a)[1]
        first = nz_c[np.sort(np.unique(nz_c, return_index=True)[1])]
        order = np.concatenate([first, np.setdiff1d(np.arange(n), first)])
        a[:, fixed] = 0.0  # appsi treats fixed variables as parameters (value 0 here): columns without entries
        return {
            "cost": np.array(cost),
            "lb": np.array(lb),
            "ub": np.array(ub),
            "integer": np.array(integer),
            "a": a,
            "row_lo": np.array(extra_lo),
            "row_hi": np.array(extra_hi),
            "order": order,
            "offset": offset,
            "x_expr": x_expr,
            "bounds": bounds,
            "pre": pres,
        }

    @staticmethod
    def highs_lp(mm: dict[str, Any]) -> Any:
        """The ``highspy.HighsLp`` of a :meth:`matrix_model` (columns in its ``order``)."""
        import highspy

        order = mm["order"]
        a = mm["a"][:, order]
        nz_r, nz_c = np.nonzero(a)
        starts = np.searchsorted(nz_r, np.arange(a.shape[0] + 1)).astype(np.int32)
        lp = highspy.HighsLp()
        lp.num_col_, lp.num_row_ = a.shape[1], a.shape[0]
        lp.col_cost_, lp.col_lower_, lp.col_upper_ = mm["cost"][order], mm["lb"][order], mm["ub"][order]
        lp.row_lower_, lp.row_upper_, lp.offset_ = mm["row_lo"], mm["row_hi"], float(mm["offset"])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = a.shape[1], a.shape[0]
        lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = starts, nz_c.astype(np.int32), a[nz_r, nz_c]
        kinds = (highspy.HighsVarType.kContinuous, highspy.HighsVarType.kInteger)
        lp.integrality_ = [kinds[int(i)] for i in mm["integer"][order]]
        return lp

    def solve_matrix(self, x0: np.ndarray, desired: int) -> CounterfactualResult:
        """The plain MIO through ``highspy`` without Pyomo (``backend="highspy"``); never raises on solver trouble.

        ``info["timing"]`` splits the time into ``build`` (:meth:`matrix_model`), ``translate`` (``passModel`` and
        the options) and ``solve`` (``Highs.run``), wall seconds and ``*_cpu`` process seconds, and ``run``
        (``Highs.getRunTime``, HiGHS's own clock). ``seconds`` is translate + solve, what the Pyomo path reports
        (its ``solver.solve``, appsi's translation included, as the official ``time_solving``).
        """
        import highspy

        w0, c0 = time.perf_counter(), time.process_time()
        mm = self.matrix_model(x0, desired)
        w1, c1 = time.perf_counter(), time.process_time()
        lp = self.highs_lp(mm)
        solver = highspy.Highs()
        solver.setOptionValue("output_flag", False)
        solver.setOptionValue("time_limit", float(self.time_limit))
        for key, value in self.highs_options.items():
            solver.setOptionValue(key, value)
        try:
            solver.passModel(lp)
            w3, c3 = time.perf_counter(), time.process_time()
            solver.run()
        except Exception as err:  # noqa: BLE001 - a solver failure is a result, not a crash
            return CounterfactualResult(f"error: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        w4, c4 = time.perf_counter(), time.process_time()
        timing = {
            "build": w1 - w0,
            "translate": w3 - w1,
            "solve": w4 - w3,
            "build_cpu": c1 - c0,
            "translate_cpu": c3 - c1,
            "solve_cpu": c4 - c3,
            "run": solver.getRunTime(),
        }
        hinfo = solver.getInfo()
        info: dict[str, Any] = {
            "timing": timing,
            "nodes": hinfo.mip_node_count,
            "lp_iterations": hinfo.simplex_iteration_count,
        }
        seconds = w4 - w1
        status = solver.getModelStatus()
        has_solution = hinfo.primal_solution_status == 2  # kSolutionStatusFeasible
        ms = highspy.HighsModelStatus
        if status == ms.kOptimal:
            name = "optimal"
        elif status in (ms.kInfeasible, ms.kUnboundedOrInfeasible):
            return CounterfactualResult("infeasible", seconds=seconds, info=info)
        elif status == ms.kTimeLimit:
            if not has_solution:
                return CounterfactualResult("time_limit_no_solution", seconds=seconds, info=info)
            name = "time_limit"
        else:
            return CounterfactualResult(f"error: termination {status.name}", seconds=seconds, info=info)
        v = np.empty(len(mm["order"]))
        v[mm["order"]] = solver.getSolution().col_value
        objective = float(hinfo.objective_function_value)

        def value(expr: Any) -> float:
            if isinstance(expr, float):
                return expr
            terms, const = expr
            return const + sum(a * v[c] for c, a in terms)

        x = np.empty(len(self.features))
        for j, (f, e) in enumerate(zip(self.features, mm["x_expr"])):
            if f.kind == "categorical":
                x[j] = float(np.argmax([value(o) for o in e]))
            elif f.kind == "binary":
                x[j] = float(round(value(e)))
            else:
                x[j] = value(e)
        x = self._snap(x, np.zeros(len(x)), np.ones(len(x)))
        return CounterfactualResult(name, x, objective, None, seconds, info)

    def _load_start(
        self, m: pyo.ConcreteModel, x0: np.ndarray, desired: int, start: np.ndarray
    ) -> tuple[float | None, float]:
        """Set every variable of ``m`` to its value at the counterfactual ``start`` (from the pinned model's solve);
        returns (the start's objective or ``None`` if the pinned model is not solved, seconds)."""
        pinned = self.build(x0, desired, fix_x=start)
        pinned.del_component(pinned.obj)
        pinned.obj = pyo.Objective(expr=pinned.distance - self.alpha * pinned.spn_root, sense=pyo.minimize)
        status, objective, seconds = self.solve_model(pinned)
        if status != "optimal":
            return None, seconds
        for var in pinned.component_data_objects(pyo.Var):
            target = m.find_component(var.name)
            if target is not None and var.value is not None:
                target.set_value(var.value, skip_validation=True)
        return objective, seconds

    def spn_value_at(self, x: np.ndarray, desired: int) -> float:
        """The MIO's root SPN value with the counterfactual pinned to ``x`` (parity with ``SPN.max_approx``)."""
        if self.spn is None:
            raise ConfigError("spn_value_at needs an SPN")
        m = self.build(x, desired, use_classifier=False, use_spn=True, fix_x=np.asarray(x, np.float64))
        status, _, _ = self.solve_model(m)
        if status != "optimal":
            raise RuntimeError(f"pinned SPN model not solved: {status}")
        return float(pyo.value(m.spn_root))


def merge_equal_bins(breaks: np.ndarray, densities: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop the breaks between consecutive bins of equal density (fewer binaries, same function)."""
    keep_b, keep_d = [float(breaks[0])], [float(densities[0])]
    for i in range(1, len(densities)):
        if np.isclose(densities[i], keep_d[-1], rtol=1e-12, atol=0.0):
            continue
        keep_b.append(float(breaks[i]))
        keep_d.append(float(densities[i]))
    keep_b.append(float(breaks[-1]))
    return np.array(keep_b), np.array(keep_d)
