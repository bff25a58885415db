"""Results-page hook of the SEMDICE tabular claim (``conf/claim/semdice.yaml``): normalised state entropy vs the
number of collected trajectories for SEMDICE (paper and official ``d_b``) and the baselines, a plot, and verdicts.

The x-axis is ``val/trajectories`` (logged beside ``val/normalized_entropy`` at every validation; ``global_step``
is not the trajectory count for every entry).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from suite.report import (
    REPRODUCED,
    UNDERFIT,
    Verdict,
    compare,
    curve_table,
    entry_curves,
    mean_sd,
    plateau,
    std_error,
    values,
    verdict_table,
)

METRIC = "val/normalized_entropy"
X = "val/trajectories"
METHOD = "semdice"
OFFICIAL = "semdice_official"
# pb_s / cb_s / cb_sa: the official code's update (the module's default); *_exact: the exact policy gradient of the
# normalised return (model.baseline_update=exact, the suite's rule before issue 47). "Best baseline" is the best of all.
BASELINES = ("uniform", "pb_s", "cb_s", "cb_sa", "pb_s_exact", "cb_s_exact", "cb_sa_exact")
CHECKPOINTS = (10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
#: The recovered d must match the policy's own stationary distribution to this L1 gap to call it converged.
RECOVERY_TOL = 0.05


def trajectory_curves(records: list[Any], name: str) -> list[dict[int, float]]:
    """Per seed of entry ``name``: ``{trajectories: normalised entropy}`` (the two curves zipped in log order)."""
    xs, ys = entry_curves(records, name, X), entry_curves(records, name, METRIC)
    return [{int(x): y for (_, x), (_, y) in zip(cx, cy)} for cx, cy in zip(xs, ys)]


def _auc(curve: dict[int, float], points: list[int]) -> float:
    """Mean normalised entropy over the log-spaced checkpoints (how fast the curve rises)."""
    return statistics.fmean(curve[p] for p in points)


def _plot(curves: dict[str, list[dict[int, float]]], out_dir: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, per_seed in curves.items():
        if not per_seed:
            continue
        xs = sorted(set.intersection(*(set(c) for c in per_seed)))
        xs = [x for x in xs if x > 0]
        if not xs:
            continue
        mean = [statistics.fmean(c[x] for c in per_seed) for x in xs]
        se = [std_error([c[x] for c in per_seed]) for x in xs]
        ax.plot(xs, mean, label=name)
        ax.fill_between(xs, [m - s for m, s in zip(mean, se)], [m + s for m, s in zip(mean, se)], alpha=0.2)
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="MaxEnt optimum")
    ax.set_xscale("log")
    ax.set_xlabel("trajectories collected")
    ax.set_ylabel("normalised state entropy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "semdice_entropy.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path.name


def claim_report(records: list[Any], out_dir: Path) -> str:
    """Markdown: entropy-vs-trajectories table (mean ± s.e. over seeds), plot, final values, verdicts."""
    out_dir = Path(out_dir)
    names = [n for n in (METHOD, OFFICIAL, *BASELINES) if any(r.name == n for r in records)]
    curves = {n: trajectory_curves(records, n) for n in names}
    common = set.intersection(*(set(c) for per in curves.values() for c in per)) if names else set()
    points = [p for p in CHECKPOINTS if p in common]
    lines = [
        "## Normalised state entropy vs trajectories collected (mean ± s.e. over seeds)",
        "",
        "0 = the uniform policy, 1 = the MaxEnt-optimal policy of the true MDP (convex program, Clarabel).",
        "",
        *curve_table(curves, names, points, digits=3),
    ]
    plot = _plot(curves, out_dir)
    if plot:
        lines += ["", f"![normalised entropy vs trajectories]({plot})"]
    gaps = values(records, METHOD, "test/recovery_gap")
    lines += [
        "",
        f"SEMDICE recovery gap ||d_recovered - d^pi_(T_hat)||_1 at the end: {mean_sd(gaps)}; "
        f"official d_b: {mean_sd(values(records, OFFICIAL, 'test/recovery_gap'))}.",
    ]

    verdicts = []
    finals = {n: values(records, n, "test/normalized_entropy") for n in names}
    present = [b for b in BASELINES if finals.get(b)]
    if finals.get(METHOD) and present:
        best = max(present, key=lambda b: statistics.fmean(finals[b]))
        converged, why = plateau([sorted(c.items()) for c in curves[METHOD]], higher_is_better=True)
        verdicts.append(
            Verdict(
                f"SEMDICE's policy ends closest to the MaxEnt optimum (normalised entropy -> 1) of all methods after "
                f"{points[-1] if points else '?'} trajectories",
                compare(finals[METHOD], finals[best], higher_is_better=True, converged=converged),
                f"SEMDICE {mean_sd(finals[METHOD])} vs best baseline {best} {mean_sd(finals[best])}; "
                f"SEMDICE curve {why}",
            )
        )
        if points:
            auc = {n: [_auc(c, points) for c in curves[n]] for n in names}
            best_auc = max(present, key=lambda b: statistics.fmean(auc[b]))
            verdicts.append(
                Verdict(
                    "SEMDICE approaches the optimum faster than the baselines (mean normalised entropy over the "
                    f"log-spaced checkpoints {points[0]}..{points[-1]})",
                    compare(auc[METHOD], auc[best_auc], higher_is_better=True),
                    f"SEMDICE {mean_sd(auc[METHOD])} vs best baseline {best_auc} {mean_sd(auc[best_auc])}",
                )
            )
    if gaps:
        ok = max(gaps) < RECOVERY_TOL
        verdicts.append(
            Verdict(
                "SEMDICE returns a single stationary Markov policy whose own stationary distribution is the "
                "recovered d",
                REPRODUCED if ok else UNDERFIT,
                f"L1 gap between recovered d and d^pi under the MLE model: max {max(gaps):.3g} over seeds "
                f"(tolerance {RECOVERY_TOL}: dual {'converged' if ok else 'not converged'})",
            )
        )
    lines += ["", "## Verdicts", "", verdict_table(verdicts) if verdicts else "No runs to judge."]
    return "\n".join(lines)
