"""Results-page hook of the deep SEMDICE pre-training check (``conf/claim/semdice_deep.yaml``): state coverage of
the pre-trained actor (SEMDICE vs APT online, as its paper runs it, vs APT offline on SEMDICE's data vs the untrained
actor vs the data's own behaviour policy), the APT curves, and the verdicts on the coverage claim."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from suite.report import Verdict, compare, entry_curves, mean_sd, plateau, values, verdict_table

METRICS = ("test/cell_entropy", "test/cells", "test/pbe")
NAMES = ("semdice", "apt_online", "apt", "init", "data")
WHAT = {
    "apt_online": "APT online (its paper's protocol: own 20k transitions, particle reward, twin critics)",
    "apt": "APT offline (DDPG on SEMDICE's fixed data)",
}


def curve_rows(records: list[Any], name: str, x_key: str | None = None) -> list[str]:
    """Markdown rows of an entry's ``val/cell_entropy`` curve: mean ± sd over seeds at each validation (``x_key``:
    a logged x such as ``val/env_steps``, else the step)."""
    curves = entry_curves(records, name, "val/cell_entropy")
    xs = entry_curves(records, name, x_key) if x_key else []
    if not curves:
        return []
    n = min(len(c) for c in curves)
    rows = []
    for i in range(n):
        vals = [c[i][1] for c in curves]
        x = int(xs[0][i][1]) if xs and len(xs[0]) > i else curves[0][i][0]
        sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
        rows.append(f"| {x} | {statistics.fmean(vals):.3f} ± {sd:.2f} |")
    return rows


def claim_report(records: list[Any], out_dir: Path) -> str:
    """Markdown: coverage table (mean ± sd over seeds) and verdicts."""
    names = [n for n in NAMES if any(r.name == n for r in records)]
    lines = [
        "## State coverage of the pre-trained actor (3 evaluation episodes of 500 steps)",
        "",
        "| entry | cell entropy (nats) | cells visited | kNN particle entropy |",
        "|---|---|---|---|",
    ]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(mean_sd(values(records, n, k)) for k in METRICS) + " |")
    verdicts = []
    sem, init = values(records, "semdice", METRICS[0]), values(records, "init", METRICS[0])
    for apt_name, claim in (
        ("apt_online", "SEMDICE pre-training maximises state entropy better than an SEM pre-training baseline (APT, "
                       "online as its paper runs it)"),
        ("apt", "SEMDICE pre-training maximises state entropy better than APT trained offline on the same data"),
    ):  # fmt: skip
        apt = values(records, apt_name, METRICS[0])
        if not (sem and apt):
            continue
        conv = all(
            plateau(entry_curves(records, n, "val/cell_entropy"), higher_is_better=True)[0]
            for n in ("semdice", apt_name)
        )
        verdicts.append(
            Verdict(
                claim,
                compare(sem, apt, higher_is_better=True, converged=conv),
                f"cell entropy SEMDICE {mean_sd(sem)} vs {apt_name} {mean_sd(apt)} vs untrained actor "
                f"{mean_sd(init)}; both curves plateaued: {conv}",
                against=(apt_name,),  # the weak-baseline rule (suite.report) judges this entry
            )
        )
    data = values(records, "data", METRICS[0])
    if sem and data:
        conv = plateau(entry_curves(records, "semdice", "val/cell_entropy"), higher_is_better=True)[0]
        verdicts.append(
            Verdict(
                "The SEMDICE actor, learnt offline from the data, covers the maze more evenly than the data's own "
                "behaviour policy (rolled out the same way)",
                compare(sem, data, higher_is_better=True, converged=conv),
                f"cell entropy SEMDICE {mean_sd(sem)} vs behaviour policy {mean_sd(data)}; cells visited "
                f"{mean_sd(values(records, 'semdice', METRICS[1]))} vs {mean_sd(values(records, 'data', METRICS[1]))}",
            )
        )
    for apt_name, x_key, x_what in (("apt_online", "val/env_steps", "environment steps"), ("apt", None, "step")):
        rows = curve_rows(records, apt_name, x_key)
        if rows:
            lines += [
                "",
                f"### Curve of {WHAT[apt_name]}: validation cell entropy (mean ± sd over seeds)",
                "",
                f"| {x_what} | val/cell_entropy |",
                "|---|---|",
                *rows,
            ]
    lines += [
        "",
        "## Verdicts",
        "",
        verdict_table(verdicts) if verdicts else "No runs to judge.",
        "",
        "The paper's second claim (best downstream adaptation among SEM pre-training methods) is checked on its "
        "own page, [semdice_finetune](semdice_finetune.md): DDPG on the task reward from these runs' actors.",
    ]
    return "\n".join(lines)
