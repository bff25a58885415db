"""Results-page hook of the SEMDICE tabular claim (``conf/claim/semdice.yaml``).

Lee et al., "SEMDICE: Off-policy State Entropy Maximization via Stationary Distribution Correction Estimation"
(ICLR 2025), tabular study: SEMDICE's policy approaches the MaxEnt optimum (normalised state entropy -> 1) faster
than the baselines, and it is a single stationary Markov policy. The comparator of each claim is the best baseline
on the runs (by the mean over seeds), so the claims are built here, from the spec's ``best_baseline_claims`` (delta
and its reason), and judged with :func:`suite.claims.judge` / :func:`suite.claims.judge_values`. The hook also
returns the entropy-vs-trajectories table and plot and the recovery gap of the dual.

The x-axis is ``val/trajectories`` (logged beside ``val/normalized_entropy`` at every validation; ``global_step``
is not the trajectory count for every entry).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from suite.claims import (
    Claim,
    ClaimSpec,
    Figure,
    HookResult,
    Table,
    default_paired,
    judge_values,
    seed_values,
    stated,
)
from suite.compare import RunRecord
from suite.report import mean_sd, zipped_curves
from suite.stats import REPRODUCED, UNDERFIT

METRIC = "val/normalized_entropy"
X = "val/trajectories"
METHOD = "semdice"
OFFICIAL = "semdice_official"
# pb_s / cb_s / cb_sa: the official code's update (the module's default); *_exact: the exact policy gradient of the
# normalised return (model.baseline_update=exact). "Best baseline" is the best of all.
BASELINES = ("uniform", "pb_s", "cb_s", "cb_sa", "pb_s_exact", "cb_s_exact", "cb_sa_exact")
CHECKPOINTS = (10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
#: The recovered d must match the policy's own stationary distribution to this L1 gap to call the dual converged.
RECOVERY_TOL = 0.05


def trajectory_curves(records: list[RunRecord], name: str) -> dict[str, dict[int, float]]:
    """Per seed of entry ``name``: ``{trajectories: normalised entropy}`` (the two curves zipped in log order)."""
    return zipped_curves(records, name, X, METRIC)


def _plot(curves: dict[str, dict[str, dict[int, float]]], out_dir: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, per_seed in curves.items():
        xs = sorted(x for x in set.intersection(*(set(c) for c in per_seed.values())) if x > 0) if per_seed else []
        if not xs:
            continue
        vals = [[c[x] for c in per_seed.values()] for x in xs]
        mean = [statistics.fmean(v) for v in vals]
        se = [statistics.stdev(v) / math.sqrt(len(v)) if len(v) > 1 else 0.0 for v in vals]
        ax.plot(xs, mean, label=name)
        ax.fill_between(xs, [m - s for m, s in zip(mean, se)], [m + s for m, s in zip(mean, se)], alpha=0.2)
    ax.axhline(1.0, color="k", lw=0.8, ls="--", label="MaxEnt optimum")
    ax.set(xscale="log", xlabel="trajectories collected", ylabel="normalised state entropy (mean ± s.e.)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / "semdice_entropy.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def claim_report(records: list[RunRecord], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """Entropy-vs-trajectories table and plot, the recovery gap, and the three verdicts."""
    names = [n for n in (METHOD, OFFICIAL, *BASELINES) if any(r.name == n for r in records)]
    curves = {n: trajectory_curves(records, n) for n in names}
    common = set.intersection(*(set(c) for per in curves.values() for c in per.values())) if names else set()
    points = [p for p in CHECKPOINTS if p in common]
    rows = []
    for n in names:
        vals = [[c[p] for c in curves[n].values()] for p in points]
        rows.append([n, *(f"{statistics.fmean(v):.3f} ± {statistics.stdev(v) if len(v) > 1 else 0:.3f}" for v in vals)])
    result = HookResult(
        tables=[
            Table(
                "Normalised state entropy vs trajectories collected (mean ± sd over seeds)",
                ["entry", *map(str, points)],
                rows,
                "0 = the uniform policy, 1 = the MaxEnt-optimal policy of the true MDP (convex program, Clarabel).",
            )
        ]
    )
    plot = _plot(curves, Path(out_dir)) if names else None
    if plot:
        result.figures.append(Figure("normalised entropy vs trajectories", plot))
    gaps = seed_values(records, METHOD, "test/recovery_gap")
    official = seed_values(records, OFFICIAL, "test/recovery_gap").values()
    result.notes.append(
        f"SEMDICE recovery gap ||d_recovered - d^pi_(T_hat)||_1 at the end: {mean_sd(gaps.values())}; "
        f"official d_b: {mean_sd(official)}."
    )
    finals = {n: seed_values(records, n, "test/normalized_entropy") for n in names}
    auc = {n: {s: statistics.fmean(c[p] for p in points) for s, c in curves[n].items()} for n in names if points}
    first, last = (points[0], points[-1]) if points else ("?", "?")  # the claims name the checkpoints read
    for cid, text, metric, values, converge in (
        (
            "final_vs_best_baseline",
            f"SEMDICE's policy ends closest to the MaxEnt optimum (normalised entropy -> 1) of "
            f"all methods after {last} trajectories",
            "test/normalized_entropy",
            finals,
            True,
        ),
        (
            "faster_than_best_baseline",
            f"SEMDICE approaches the optimum faster than the baselines (mean normalised "
            f"entropy over the log-spaced checkpoints {first}..{last})",
            f"mean {METRIC} over checkpoints",
            auc,
            False,
        ),
    ):
        present = [b for b in BASELINES if values.get(b)]
        if values.get(METHOD) and present:
            claim = _against_best(cid, text, metric, values, present, spec)
            ok, reading = spec.convergence(records).get(METHOD, (False, "no validation curve logged"))
            unconverged = None if ok or not converge else {METHOD: reading}  # how fast: read whatever the end
            paired = default_paired(records, *claim.entries)  # one MDP per seed
            result.verdicts.append(
                judge_values(claim, *(values[e] for e in claim.entries), paired=paired, unconverged=unconverged)
            )
    if gaps:
        ok = max(gaps.values()) < RECOVERY_TOL
        result.verdicts.append(
            stated(
                "single_stationary_policy",
                "SEMDICE returns a single stationary Markov policy whose own stationary distribution is the "
                "recovered d",
                REPRODUCED if ok else UNDERFIT,
                f"L1 gap between recovered d and d^pi under the MLE model: max {max(gaps.values()):.3g} over seeds "
                f"(tolerance {RECOVERY_TOL}: dual {'converged' if ok else 'not converged'})",
            )
        )
    return result


def _against_best(cid: str, text: str, metric: str, values: dict, present: list[str], spec: ClaimSpec) -> Claim:
    """SEMDICE against the best baseline by its mean (``values``: entry -> {seed: value}), with the spec's
    ``best_baseline_claims`` delta; primary."""
    cfg = spec.get("best_baseline_claims") or {}
    best = max(present, key=lambda b: statistics.fmean(values[b].values()))
    text = f"{text} (against the best baseline, `{best}`)"
    return Claim(
        cid,
        text,
        metric,
        (METHOD, best),
        higher_is_better=True,
        delta=float(cfg.get("delta", 0.0)),
        delta_why=str(cfg.get("delta_why", "")),
        primary=True,
    )
