"""Fit Davidson(k_cov=0, k_tie=1) on the bundled Chatbot Arena data with the suite and with the leaderbot package.

Prints both wall times, both NLLs (mean per vote, no constraint terms) and the time ratio suite / package
(goal: <= 0.1 at an equal or lower NLL), and the Kendall tau between the two rankings. Both run in this one process
on the same data, alternating over ``--rounds`` interleaved rounds (a fresh package model each round); the ratio is
printed with its 95% interval over the rounds (``benchmarks/_timing.py``). The package's numba kernels are compiled
before timing (one loss call), so its time is the optimisation only. The suite's solver is the default one
(``--solver newton``: damped Newton with the exact Hessian, 60 steps of 5 iterations at most, as ``make train``) or
``--solver lbfgs``. ``--quick`` stops both fits early (their NLLs then differ).

    python benchmarks/leaderbot_fit.py [--kind davidson --k-cov 0 --k-tie 1] [--solver newton|lbfgs] [--threads 1]
        [--rounds 5] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._timing import add_args, describe, header, interleave, ratio_interval, rounds_of  # noqa: E402
from datamodules.arena import embedded_path, read_votes  # noqa: E402
from lightning_modules.leaderbot import likelihoods as lk  # noqa: E402
from lightning_modules.leaderbot.fit import fit_lbfgs, fit_newton  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="davidson", choices=["bradley_terry", "rao_kupper", "davidson"])
    parser.add_argument("--k-cov", default="0", help="'none' or an integer")
    parser.add_argument("--k-tie", type=int, default=1)
    parser.add_argument("--solver", default="newton", choices=["newton", "lbfgs"], help="the suite's solver")
    parser.add_argument("--max-steps", type=int, default=None, help="suite steps (newton 60 x 5, lbfgs 150 x 20)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 is fastest at this size)")
    add_args(parser)
    args = parser.parse_args()
    rounds = rounds_of(parser, args)
    torch.set_num_threads(args.threads)
    k_cov = None if args.k_cov.lower() == "none" else int(args.k_cov)
    import leaderbot as lb
    from scipy.stats import kendalltau

    votes = read_votes(embedded_path())
    data = {"models": votes["models"], "X": votes["pairs"], "Y": votes["counts"]}
    pairs, counts = torch.as_tensor(votes["pairs"]), torch.as_tensor(votes["counts"], dtype=torch.float64)
    layout = lk.Layout(args.kind, len(votes["models"]), k_cov, args.k_tie if args.kind != "bradley_terry" else 0)
    cls = {"bradley_terry": lb.BradleyTerry, "rao_kupper": lb.RaoKupper, "davidson": lb.Davidson}[args.kind]
    pkg_iter, suite_steps = (20, 3) if args.quick else (1500, args.max_steps)
    fits: dict[str, list] = {"package": [], "suite": []}

    def package() -> float:
        pkg = cls(data, k_cov=k_cov) if args.kind == "bradley_terry" else cls(data, k_cov=k_cov, k_tie=args.k_tie)
        pkg.loss(np.zeros(pkg.n_param) + 0.1, return_jac=True, constraint=True)  # JIT-compile outside the timing
        t0 = time.perf_counter()
        pkg.train(max_iter=pkg_iter)
        seconds = time.perf_counter() - t0
        fits["package"].append(pkg)
        return seconds

    def suite() -> float:
        if args.solver == "newton":
            res = fit_newton(layout, pairs, counts, max_steps=suite_steps or 60)
        else:
            res = fit_lbfgs(layout, pairs, counts, max_steps=suite_steps or 150)
        fits["suite"].append(res)
        return res.seconds

    t = interleave({"package": package, "suite": suite}, rounds)
    pkg, res = fits["package"][-1], fits["suite"][-1]
    nll_pkg = float(pkg.loss(constraint=False))
    label = "suite   (torch Newton, exact H)" if args.solver == "newton" else "suite   (torch L-BFGS)        "
    tau = kendalltau(res.w[: layout.m].numpy(), pkg.param[: layout.m]).statistic
    print(f"model: {args.kind}(k_cov={k_cov}, k_tie={layout.k_tie}), {layout.n_param} parameters, {len(pairs)} pairs")
    print(header(rounds))
    print(f"package (scipy BFGS, numba)    : {statistics.median(t['package']):8.2f} s (median)  NLL {nll_pkg:.8f}")
    print(f"{label}: {statistics.median(t['suite']):8.2f} s (median)  NLL {res.nll:.8f}  ({res.iterations} iterations)")
    iv = ratio_interval(t["suite"], t["package"])
    nll_ok = res.nll <= nll_pkg + 1e-9
    verdict = describe(iv, goal=0.1) if nll_ok else f"{describe(iv)}; goal <= 0.1x: goal missed (higher NLL)"
    print(f"time ratio suite/package: {verdict}   NLL suite - package: {res.nll - nll_pkg:+.2e}")
    print(f"Kendall tau between the two rankings: {tau:.4f}")


if __name__ == "__main__":
    main()
