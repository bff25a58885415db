"""Results-page hook of the deep SEMDICE pre-training check (``conf/claim/semdice_deep.yaml``).

Lee et al., "SEMDICE: Off-policy State Entropy Maximization via Stationary Distribution Correction Estimation"
(ICLR 2025): SEMDICE pre-training maximises state entropy better than the SEM pre-training baselines. The verdicts
(SEMDICE vs APT online as its paper runs it, vs APT offline on SEMDICE's data, vs the data's own behaviour policy) are
the spec's declared claims; this hook adds the state-coverage table of every entry (with the untrained actor, the
floor the weak-baseline rule reads APT against) and the APT validation curves."""

from __future__ import annotations

import statistics
from pathlib import Path

from suite.claims import ClaimSpec, HookResult, Table, seed_values
from suite.compare import RunRecord
from suite.report import entry_curves, mean_sd

METRICS = ("test/cell_entropy", "test/cells", "test/pbe")
NAMES = ("semdice_on_apt", "apt_online", "semdice", "apt", "init", "data")
WHAT = {
    "apt_online": "APT online (its paper's protocol: own 20k transitions, particle reward, twin critics)",
    "apt": "APT offline (DDPG on SEMDICE's fixed data)",
}


def curve_rows(records: list[RunRecord], name: str, x_key: str | None = None) -> list[list[str]]:
    """Rows ``[x, mean ± sd]`` of an entry's ``val/cell_entropy`` curve over seeds at each validation (``x_key``: a
    logged x such as ``val/env_steps``, else the step)."""
    curves = entry_curves(records, name, "val/cell_entropy")
    xs = entry_curves(records, name, x_key) if x_key else []
    rows = []
    for i in range(min((len(c) for c in curves), default=0)):
        vals = [c[i][1] for c in curves]
        x = int(xs[0][i][1]) if xs and len(xs[0]) > i else curves[0][i][0]
        rows.append([str(x), f"{statistics.fmean(vals):.3f} ± {statistics.stdev(vals) if len(vals) > 1 else 0:.2f}"])
    return rows


def claim_report(records: list[RunRecord], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """The coverage table (mean ± sd over seeds) and the APT curves."""
    names = [n for n in NAMES if any(r.name == n for r in records)]
    coverage = [[n, *(mean_sd(seed_values(records, n, k).values()) for k in METRICS)] for n in names]
    tables = [
        Table(
            "State coverage of the pre-trained actor (3 evaluation episodes of 500 steps)",
            ["entry", "cell entropy (nats)", "cells visited", "kNN particle entropy"],
            coverage,
        )
    ]
    for apt, x_key, x_what in (("apt_online", "val/env_steps", "environment steps"), ("apt", None, "step")):
        rows = curve_rows(records, apt, x_key)
        if rows:
            tables.append(
                Table(
                    f"Curve of {WHAT[apt]}: validation cell entropy (mean ± sd over seeds)",
                    [x_what, "val/cell_entropy"],
                    rows,
                )
            )
    note = (
        "The paper's second claim (best downstream adaptation among SEM pre-training methods) is checked on its own "
        "page, [semdice_finetune](semdice_finetune.md): DDPG on the task reward from these runs' actors."
    )
    return HookResult(tables=tables, notes=[note])
