"""Results-page hook of the deep SEMDICE pre-training check (``conf/claim/semdice_deep.yaml``): state coverage of
the pre-trained actor (SEMDICE vs APT vs the untrained actor vs the data's own behaviour policy) and the verdicts on
the coverage claim."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from suite.report import Verdict, compare, entry_curves, mean_sd, plateau, values, verdict_table

METRICS = ("test/cell_entropy", "test/cells", "test/pbe")


def claim_report(records: list[Any], out_dir: Path) -> str:
    """Markdown: coverage table (mean ± sd over seeds) and verdicts."""
    names = [n for n in ("semdice", "apt", "init", "data") if any(r.name == n for r in records)]
    lines = [
        "## State coverage of the pre-trained actor (3 evaluation episodes of 500 steps)",
        "",
        "| entry | cell entropy (nats) | cells visited | kNN particle entropy |",
        "|---|---|---|---|",
    ]
    for n in names:
        lines.append(f"| {n} | " + " | ".join(mean_sd(values(records, n, k)) for k in METRICS) + " |")
    verdicts = []
    sem, apt = values(records, "semdice", METRICS[0]), values(records, "apt", METRICS[0])
    if sem and apt:
        conv = all(
            plateau(entry_curves(records, n, "val/cell_entropy"), higher_is_better=True)[0] for n in ("semdice", "apt")
        )
        verdicts.append(
            Verdict(
                "SEMDICE pre-training maximises state entropy better than an SEM pre-training baseline (APT)",
                compare(sem, apt, higher_is_better=True, converged=conv),
                f"cell entropy SEMDICE {mean_sd(sem)} vs APT {mean_sd(apt)} vs untrained actor "
                f"{mean_sd(values(records, 'init', METRICS[0]))}; both curves plateaued: {conv}",
                against=("apt",),  # the weak-baseline rule (suite.report): the evidence names it "APT"
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
