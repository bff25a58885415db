"""Results-page hook of the grass claim (``report: reports.grass:claim_report``).

GRASS (Graph Attention with Stochastic Structures, ICLR 2025) claims the lowest ZINC test MAE among graph
transformers and MPNNs at the ~500k-parameter budget (a 20.3% reduction). The verdicts are the spec's declared claims
(``conf/claim/grass.yaml``: GRASS vs GINE and vs GraphGPS, and the rewiring / RRWP ablations); this hook supplies the
convergence evidence they need (the 4x checks: the one-cycle schedule anneals to 1e-7 and flattens every validation
curve, so the best-so-far rule alone cannot tell a converged run from a cooled one), the D-RRWP comparison the paper
makes no claim about, the ordering at 4x the epochs and the parameter counts (the equal-budget check)."""

from __future__ import annotations

import statistics
from pathlib import Path

from suite import stats
from suite.claims import ClaimSpec, HookResult, Table, fmt, seed_values
from suite.compare import RunRecord
from suite.report import apply_longer_checks, longer_run_check, main_runs

BASES = ("grass", "gine", "gps")
# entries without a longer run of their own inherit GRASS's check (same model family, same one-cycle schedule)
INHERIT = ("grass_no_rewiring", "grass_drrwp", "grass_no_rrwp")


def longer_checks(records: list[RunRecord]) -> dict[str, tuple[bool, str]]:
    """The 4x check of every entry that has a ``<entry>_long`` run (seed 0, test MAE; tolerance 1% of the value)."""
    out = {}
    for base in BASES:
        check = longer_run_check(records, base, "test/mae", higher_is_better=False)
        if check is not None:
            out[base] = check
    return out


def long_ordering(mae: dict[str, dict[str, float]]) -> str | None:
    """The ordering of GRASS and the baselines at 4x the epochs (seed 0: one number each, so an ordering, not a
    verdict), beside the main runs' ordering; ``None`` without ``grass_long`` and at least one baseline's.

    Args:
        mae: entry -> {seed: test MAE}.
    """
    long = {b: next(iter(mae[f"{b}_long"].values())) for b in BASES if mae.get(f"{b}_long")}
    if "grass" not in long or len(long) < 2:
        return None
    order = sorted(long, key=long.get)
    main = {b: statistics.fmean(mae[b].values()) for b in long if mae.get(b)}
    main_order = sorted(main, key=main.get)
    same = ""
    if set(main) == set(long):
        same = "; the same ordering as the main runs" if main_order == order else "; the main runs order them "
        same += "" if main_order == order else " < ".join(main_order)
    listed = ", ".join(f"{b}_long {long[b]:.4f}" for b in order)
    lead = "GRASS lowest" if order[0] == "grass" else f"GRASS not lowest ({order[0]} is)"
    return f"Ordering at 4x the epochs (seed 0 only, so no interval and no verdict): {listed}: {lead}{same}."


def claim_report(records: list[RunRecord], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """The 4x checks as convergence evidence, the D-RRWP row, the 4x ordering and the parameter counts.

    Args:
        records: the claim's runs.
        spec: the grass claim spec.
        out_dir: the page's folder (unused: no figure).
    """
    checks = longer_checks(records)
    convergence = apply_longer_checks(spec.convergence(records), checks, {n: ("grass",) for n in INHERIT})
    tables = []
    if checks:
        rows = [[f"`{b}`", "converged" if ok else "not converged", why] for b, (ok, why) in checks.items()]
        tables.append(
            Table(
                "4x sizing checks (seed 0 at 4x the epochs against the same seed's main run, test MAE)",
                ["entry", "result", "reading"],
                rows,
                "A failed check marks its entry underfit whatever its validation curve says; the ablations inherit "
                "GRASS's (the same network and schedule with one component changed).",
            )
        )
    grass, drrwp = seed_values(records, "grass", "test/mae"), seed_values(records, "grass_drrwp", "test/mae")
    if len(grass) > 1 and len(drrwp) > 1:
        # The paper offers D-RRWP as an alternative encoding, not as a claim: an interval, no verdict.
        iv = stats.interval(drrwp, grass, paired=False, sign=-1.0)
        tables.append(
            Table(
                "D-RRWP in place of RRWP (no claim: the paper offers it as an alternative)",
                ["entry", "test MAE (mean)", "GRASS's MAE minus this one [95% CI, Welch]", "n"],
                [["grass_drrwp", f"{statistics.fmean(drrwp.values()):.4f}", _iv(iv), f"{len(drrwp)}/{len(grass)}"]],
            )
        )
    notes = []
    mae = {n: seed_values(records, n, "test/mae") for n in dict.fromkeys(r.name for r in records)}
    ordering = long_ordering(mae)
    if ordering:
        notes.append(ordering)
    params = {r.name: r.metrics["test/params"] for r in main_runs(records) if "test/params" in r.metrics}
    if params:
        notes.append("Trainable parameters (`test/params`): " + ", ".join(f"{k} {int(v):,}" for k, v in params.items()))
    return HookResult(tables=tables, notes=notes, convergence=convergence)


def _iv(iv: stats.Interval) -> str:
    return f"{fmt(iv.diff)} [{fmt(iv.lo)}, {fmt(iv.hi)}]"
