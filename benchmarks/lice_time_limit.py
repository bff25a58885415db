"""LiCE-optimise under a solver time limit: what the best solution found depends on (docs/results/lice_notes.md).

Trains the claim's classifier (German credit, ``trainer.max_epochs=20``, seed 0; ``--epochs``) and SPN, picks the
claim's test rows, and solves LiCE-optimise (alpha = 0.1) on each with HiGHS under several settings, printing per
row the objective, HiGHS's dual bound and the status:

* ``base``: the suite's settings (``--time-limit`` seconds);
* ``gap1e-4``: a histogram upper-bin gap of 1e-4 instead of the official 1e-6;
* ``warm``: the same model, warm-started from the plain MIO counterfactual (a feasible point of LiCE-optimise);
* ``heur``: HiGHS ``mip_heuristic_effort`` 0.3 (default 0.05);
* ``long``: ``--long-limit`` seconds, the reference for "how good the time-limited solution is".

It also prints the largest sum-node big-M of the encoding (the official code uses 100). It prints no ratio: only the
objectives are meant to be compared (the seconds are one measurement each on a possibly shared machine).

    python benchmarks/lice_time_limit.py [--rows 8] [--time-limit 15] [--long-limit 60] [--only-timeouts] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lightning as L  # noqa: E402
import pyomo.environ as pyo  # noqa: E402
import torch  # noqa: E402

from datamodules.tabular import TabularDataModule  # noqa: E402
from lightning_modules.lice import LiceLitModule  # noqa: E402
from lightning_modules.lice.mio import LiceMIO, appsi_highs, feature_costs, mlp_forward  # noqa: E402


def solve(mio: LiceMIO, m: pyo.ConcreteModel, warm: bool = False, options: dict | None = None) -> dict:
    """Solve ``m`` like ``LiceMIO.solve_model`` but keep the dual bound; returns a summary dict."""
    from pyomo.contrib.appsi.base import TerminationCondition as TC

    solver = appsi_highs()
    solver.config.time_limit = float(mio.time_limit)
    solver.config.load_solution = False
    solver.config.warmstart = warm
    solver.highs_options = {"mip_feasibility_tolerance": 1e-7, "primal_feasibility_tolerance": 1e-7, **(options or {})}
    start = time.perf_counter()
    res = solver.solve(m)
    seconds = time.perf_counter() - start
    obj = res.best_feasible_objective
    ok = obj is not None and np.isfinite(obj)
    if ok:
        res.solution_loader.load_vars()
    status = {TC.optimal: "optimal", TC.maxTimeLimit: "time_limit"}.get(res.termination_condition, "other")
    return {"status": status, "obj": float(obj) if ok else None, "bound": res.best_objective_bound, "s": seconds}


def copy_values(src: pyo.ConcreteModel, dst: pyo.ConcreteModel) -> None:
    """Give every variable of ``dst`` the value of the same-named variable of ``src`` (the MIP start)."""
    for v in src.component_data_objects(pyo.Var):
        w = dst.find_component(v.name)
        if w is not None and v.value is not None:
            w.set_value(v.value, skip_validation=True)


def max_sum_big_m(mio: LiceMIO) -> float:
    spn, bounds, best = mio.spn, mio.spn.node_bounds(), 0.0
    for node in spn.nodes:
        if hasattr(node, "weights"):
            logw = np.log(node.weights)
            hi = max(bounds[c.id][1] + lw for c, lw in zip(node.children, logw))
            best = max(best, max(hi - (bounds[c.id][0] + lw) for c, lw in zip(node.children, logw)))
    return float(best)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--time-limit", type=float, default=15.0)
    parser.add_argument("--long-limit", type=float, default=60.0)
    parser.add_argument("--only-timeouts", action="store_true", help="run the variants only where base timed out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=20, help="classifier training epochs (the claim's 20)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 row, 1 epoch, 1 s / 2 s limits")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.epochs, args.time_limit, args.long_limit = 1, 1, 1.0, 2.0
    torch.set_num_threads(1)
    L.seed_everything(args.seed, verbose=False)
    dm = TabularDataModule(dataset="german", seed=args.seed)
    dm.prepare_data()
    dm.setup("fit")
    module = LiceLitModule(
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=1e-2),
        num_counterfactuals=args.rows,
        seed=args.seed,
    )
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=dm)
    features, train, labels = dm.features, dm.tables["train"], dm.labels["train"]
    spn = module.fit_spn(features, train, labels, module.spn_max_rows)
    costs = feature_costs(features, train, module.mad_floor)
    layers = module.mlp_layers()
    test = dm.tables["test"]
    rows = np.sort(np.random.default_rng(args.seed).permutation(len(test))[: min(args.rows, len(test))])

    def make(gap: float = 1e-6, limit: float = args.time_limit, objective: str = "optimize") -> LiceMIO:
        return LiceMIO(
            features,
            layers,
            costs,
            spn if objective != "mio" else None,
            objective,
            alpha=0.1,
            time_limit=limit,
            bin_gap=gap,
        )

    base = make()
    print(f"SPN nodes {len(spn)}; largest sum-node big-M {max_sum_big_m(base):.1f} (official: 100)")
    print("row | variant | status | objective | dual bound | seconds")
    for r in rows:
        x0 = test[r]
        desired = int(mlp_forward(layers, dm.encode(np.atleast_2d(x0)))[0] < 0)
        m = base.build(x0, desired)
        out = {"base": solve(base, m)}
        if args.only_timeouts and out["base"]["status"] == "optimal":
            print(f"{r} | base | {out['base']['status']} | {out['base']['obj']:.4f} | - | {out['base']['s']:.1f}")
            continue
        old = make(gap=1e-4)
        out["gap1e-4"] = solve(old, old.build(x0, desired))
        # warm start: the MIO CE, completed to every variable of the LiCE model by a pinned solve
        mio = make(objective="mio")
        mm = mio.build(x0, desired)
        s_mio = solve(mio, mm)
        if s_mio["obj"] is not None:
            x_mio = mio.decode(mm)
            pinned = base.build(x0, desired, fix_x=x_mio)
            pinned.del_component(pinned.obj)
            pinned.obj = pyo.Objective(expr=pinned.distance - base.alpha * pinned.spn_root, sense=pyo.minimize)
            s_pin = solve(base, pinned)
            m_warm = base.build(x0, desired)
            copy_values(pinned, m_warm)
            out["warm"] = solve(base, m_warm, warm=True)
            out["warm"]["start"] = s_pin["obj"]
        out["heur"] = solve(base, base.build(x0, desired), options={"mip_heuristic_effort": 0.3})
        long = make(limit=args.long_limit)
        out["long"] = solve(long, long.build(x0, desired))
        for name, s in out.items():
            obj = "-" if s["obj"] is None else f"{s['obj']:.4f}"
            extra = f" (MIP start {s['start']:.4f})" if "start" in s and s["start"] is not None else ""
            print(f"{r} | {name} | {s['status']} | {obj}{extra} | {s['bound']:.4f} | {s['s']:.1f}", flush=True)


if __name__ == "__main__":
    main()
