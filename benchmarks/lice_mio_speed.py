"""LiCE plain MIO: where the time per factual goes (model build, translation to HiGHS, HiGHS solve), Pyomo path vs
the direct matrix-form highspy path.

For one dataset it trains the claim's classifier (ReLU MLP [20, 10], AdamW, BCE-with-logits, seeded), picks 10 test
factuals (desired class = the flipped prediction) and solves the plain MIO (distance only, no SPN) on each twice:

* ``pyomo``: ``LiceMIO(..., backend="pyomo")`` -- the Pyomo model (``build``), appsi's translation of it into a
  ``highspy.Highs`` model (``translate``: ``set_instance``, the first step of ``solver.solve`` on a new model) and
  the rest of ``solver.solve`` (``solve``: options, ``Highs.run``, reading the result back);
* ``matrix``: ``LiceMIO(..., backend="highspy")`` -- the same MIO assembled as a sparse matrix in numpy (``build``),
  passed to HiGHS with ``passModel`` (``translate``) and solved (``solve``).

Every factual is solved in ``--rounds`` rounds, round ``r`` with HiGHS ``random_seed = r``, the two paths alternating
(their order rotating by round). It prints per factual and the mean: the three parts, the total, the optimal
objectives of both paths (they must agree) and the ratios ``matrix / pyomo`` of the round's mean totals, both in wall
time (``perf_counter``) and in CPU time (``process_time``, robust when the machine is shared), each with its 95%
interval over the rounds (``benchmarks/_timing.py``).

Datasets: ``german`` (the embedded UCI file, 20 features of all three kinds) or ``gmsc`` (GMSC-shaped synthetic:
a ``cs-training.csv`` with Kaggle's header written to a temporary directory and read by the suite's GMSC loader, so
the 10 integer/real features, monotonicity and normalisation are GMSC's; the values are drawn from distributions
roughly matching the real marginals, heavy tails included, because the real file is not available here).

    python benchmarks/lice_mio_speed.py [--dataset gmsc|german] [--rows 10] [--seed 0] [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks._timing import add_args, describe, header, ratio_interval, round_order, rounds_of  # noqa: E402
from datamodules.tabular import GMSC_COLUMNS, TabularDataModule  # noqa: E402
from lightning_modules.lice.mio import LiceMIO, feature_costs, mlp_forward  # noqa: E402
from lightning_modules.lice.module import relu_mlp  # noqa: E402


def write_gmsc_like(path: Path, n: int, seed: int) -> None:
    """A synthetic ``cs-training.csv`` (Kaggle's header and column types; marginals roughly like the real ones)."""
    rng = np.random.default_rng(seed)
    util = np.clip(rng.beta(0.6, 1.2, n), 0, None)
    util[rng.random(n) < 0.002] = rng.uniform(2, 50000, int(np.sum(rng.random(n) < 0.002)) or 1)[0]
    age = np.clip(np.round(rng.normal(52, 14.5, n)), 21, 103)
    u1 = np.minimum(util, 1.0)
    late = rng.poisson(0.25 + 0.8 * u1, n)
    late[rng.random(n) < 0.002] = 98
    debt = rng.lognormal(-1.0, 1.0, n)
    debt[rng.random(n) < 0.15] = rng.lognormal(6.0, 1.5, int(np.sum(rng.random(n) < 0.15)) or 1)[0]
    income = np.round(rng.lognormal(8.6, 0.7, n))
    income[rng.random(n) < 0.001] = 3_008_750
    lines = rng.poisson(8.5, n)
    late90 = rng.poisson(0.1 + 0.5 * u1, n)
    late90[late == 98] = 98  # the real file's 96/98 codes sit in all three past-due columns at once
    estate = rng.poisson(1.0, n)
    late60 = rng.poisson(0.1 + 0.3 * u1, n)
    late60[late == 98] = 98
    deps = np.minimum(rng.poisson(0.75, n), 20)
    score = -3.2 + 2.2 * u1 + 0.9 * late + 1.2 * late90 + 0.9 * late60 - 0.02 * (age - 52) + rng.logistic(size=n)
    label = (score > 0).astype(int)  # 1 = serious delinquency (about 10 %)
    cols = [label, util, age, late, debt, income, lines, late90, estate, late60, deps]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([""] + GMSC_COLUMNS)
        for i in range(n):
            w.writerow([i + 1] + [f"{c[i]:.6g}" if c is util or c is debt else int(c[i]) for c in cols])


def train_mlp(x: np.ndarray, y: np.ndarray, seed: int, epochs: int = 50) -> list[tuple[np.ndarray, np.ndarray]]:
    """The claim's classifier: ReLU MLP [20, 10], AdamW, BCE-with-logits; returns ``[(W, b), ...]`` in float64."""
    torch.manual_seed(seed)
    net = relu_mlp(x.shape[1], [20, 10])
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-2)
    xt, yt = torch.from_numpy(x).float(), torch.from_numpy(y).float()
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(xt), generator=gen).split(64):
            opt.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(net(xt[idx])[:, 0], yt[idx]).backward()
            opt.step()
    return [
        (m.weight.detach().double().numpy(), m.bias.detach().double().numpy())
        for m in net
        if isinstance(m, torch.nn.Linear)
    ]


def timed_pyomo(mio: LiceMIO, x0: np.ndarray, desired: int) -> dict:
    """The Pyomo path, split into build / translate / solve (wall and CPU seconds)."""
    from pyomo.contrib.appsi.solvers import Highs

    w0, c0 = time.perf_counter(), time.process_time()
    m = mio.build(x0, desired)
    w1, c1 = time.perf_counter(), time.process_time()
    solver = Highs()
    solver.config.time_limit = float(mio.time_limit)
    solver.config.load_solution = False
    solver.config.stream_solver = False
    solver.config.log_level = logging.DEBUG
    solver.highs_options = dict(mio.highs_options)
    solver.set_instance(m)  # what solver.solve(m) does first for a new model
    w2, c2 = time.perf_counter(), time.process_time()
    for key in (
        "check_for_new_or_removed_constraints",
        "check_for_new_or_removed_vars",
        "check_for_new_or_removed_params",
        "check_for_new_objective",
        "update_constraints",
        "update_vars",
        "update_params",
        "update_named_expressions",
        "update_objective",
    ):
        setattr(solver.update_config, key, False)  # nothing changed since set_instance: skip appsi's re-scan
    res = solver.solve(m)
    w3, c3 = time.perf_counter(), time.process_time()
    obj, run = float(res.best_feasible_objective), solver._solver_model.getRunTime()
    return {
        "build": (w1 - w0, c1 - c0),
        "translate": (w2 - w1, c2 - c1),
        "solve": (w3 - w2, c3 - c2),
        "obj": obj,
        "run": run,
    }


def timed_matrix(mio: LiceMIO, x0: np.ndarray, desired: int) -> dict:
    """The matrix path: its own build / translate / solve split (``LiceMIO.solve_matrix``)."""
    res = mio.generate(x0, desired)
    t = res.info["timing"]
    return {k: (t[k], t[k + "_cpu"]) for k in ("build", "translate", "solve")} | {"obj": res.objective, "run": t["run"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="gmsc", choices=["gmsc", "german"])
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gmsc-rows", type=int, default=20000, help="size of the synthetic GMSC table")
    parser.add_argument("--epochs", type=int, default=20)
    add_args(parser)
    parser.add_argument("--highs-seeds", dest="rounds", type=int, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    rounds = rounds_of(parser, args)
    if args.quick:
        args.rows, args.gmsc_rows, args.epochs = 2, 2000, 2
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        if args.dataset == "gmsc":
            write_gmsc_like(Path(tmp) / "cs-training.csv", args.gmsc_rows, args.seed)
            dm = TabularDataModule(dataset="gmsc", source="real", data_dir=tmp, seed=args.seed)
        else:
            dm = TabularDataModule(dataset="german", seed=args.seed)
        dm.prepare_data()
        dm.setup("fit")
    features, train, labels = dm.features, dm.tables["train"], dm.labels["train"]
    layers = train_mlp(dm.encode(train), labels, args.seed, args.epochs)
    costs = feature_costs(features, train)
    test = dm.tables["test"]
    rows = np.sort(np.random.default_rng(args.seed).permutation(len(test))[: args.rows])
    slow = LiceMIO(features, layers, costs, None, "mio", time_limit=60.0, backend="pyomo")
    fast = LiceMIO(features, layers, costs, None, "mio", time_limit=60.0, backend="highspy")
    print(f"{args.dataset}: {len(features)} features, classifier input {layers[0][0].shape[1]}, rows {list(rows)}")
    x_warm = test[rows[0]]  # warm-up (imports, first-call costs), untimed
    d_warm = int(mlp_forward(layers, dm.encode(np.atleast_2d(x_warm)))[0] < 0)
    timed_pyomo(slow, x_warm, d_warm), timed_matrix(fast, x_warm, d_warm)
    keys = ("build", "translate", "solve")
    # t[path]: [seed, row, (build, translate, solve) x (wall, cpu)] and the objectives [seed, row]
    t = {p: np.zeros((rounds, len(rows), 3, 2)) for p in ("pyomo", "matrix")}
    obj = {p: np.zeros((rounds, len(rows))) for p in ("pyomo", "matrix")}
    run = {p: np.zeros((rounds, len(rows))) for p in ("pyomo", "matrix")}
    for s in range(rounds):
        slow.highs_options["random_seed"] = fast.highs_options["random_seed"] = s
        for i, r in enumerate(rows):
            x0 = test[r]
            desired = int(mlp_forward(layers, dm.encode(np.atleast_2d(x0)))[0] < 0)
            for name in round_order(["pyomo", "matrix"], s):
                fn, mio = (timed_pyomo, slow) if name == "pyomo" else (timed_matrix, fast)
                res = fn(mio, x0, desired)
                t[name][s, i] = [res[k] for k in keys]
                obj[name][s, i], run[name][s, i] = res["obj"], res["run"]
    print(f"per factual, mean over HiGHS random_seed 0..{rounds - 1} (ms)")
    print("row | path | build | translate | HiGHS solve | total (wall) | total (cpu) | objective")
    for i, r in enumerate(rows):
        for p in t:
            m = t[p][:, i].mean(0) * 1e3
            parts = " | ".join(f"{v:.1f}" for v in m[:, 0])
            print(f"{r} | {p} | {parts} | {m[:, 0].sum():.1f} | {m[:, 1].sum():.1f} | {obj[p][0, i]:.6f}")
    print("mean over factuals and seeds (ms): path | clock | build | translate | HiGHS solve | total")
    for p in t:
        for c, clock in enumerate(("wall", "cpu")):
            m = t[p][..., c].mean((0, 1)) * 1e3
            print(f"{p} | {clock} | " + " | ".join(f"{v:.1f}" for v in m) + f" | {m.sum():.1f}")
    print(
        "of which Highs.run on HiGHS's own clock (wall ms): " + "; ".join(f"{p} {1e3 * run[p].mean():.1f}" for p in t)
    )
    per_seed = {p: t[p][..., 1].sum(-1).mean(1) * 1e3 for p in t}
    print(
        "mean cpu total per HiGHS seed (ms): "
        + "; ".join(f"{p} " + ", ".join(f"{v:.0f}" for v in per_seed[p]) for p in t)
    )
    print(f"largest objective difference pyomo vs matrix: {np.max(np.abs(obj['pyomo'] - obj['matrix'])):.2e}")
    # per round (= HiGHS seed): the mean over factuals of the total, build + translate, and the HiGHS solve
    parts = {"total": slice(0, 3), "build + translate": slice(0, 2), "HiGHS solve alone": slice(2, 3)}
    print(header(rounds))
    for part, sl in parts.items():
        ivs = [
            describe(ratio_interval(t["matrix"][:, :, sl, c].sum(-1).mean(1), t["pyomo"][:, :, sl, c].sum(-1).mean(1)))
            for c in (0, 1)
        ]
        print(f"ratio matrix / pyomo, {part}: wall {ivs[0]}; cpu {ivs[1]}")
    share = ratio_interval(t["pyomo"][:, :, 2, 1].mean(1), t["pyomo"][:, :, :, 1].sum(-1).mean(1))
    print(f"HiGHS solve share of the pyomo path (cpu): {describe(share, '%')}")


if __name__ == "__main__":
    main()
