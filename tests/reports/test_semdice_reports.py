"""SEMDICE deep / downstream report hooks: coverage and return tables, curves and verdicts from fake runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from reports.semdice_deep import claim_report as deep_report
from reports.semdice_finetune import claim_report as finetune_report
from reports.semdice_finetune import return_curves


@dataclass
class _Rec:
    name: str
    metrics: dict[str, float] = field(default_factory=dict)
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


def _ft(name: str, levels: list[float], final: float) -> _Rec:
    steps = [(i, 1000.0 * (i + 1)) for i in range(len(levels))]
    return _Rec(name, {"test/return": final}, {"val/return": list(enumerate(levels)), "val/env_steps": steps})


def test_finetune_report_curves_and_verdicts(tmp_path):
    recs = [_ft("semdice", [50, 120, 150, 150 + s, 151], 151 + s) for s in (0, 1, 2)]
    recs += [_ft("apt", [20, 40, 60, 61, 60 + s], 60 + s) for s in (0, 1, 2)]
    recs += [_ft("scratch", [10, 20, 30 + s, 31, 31], 31 + s) for s in (0, 1, 2)]
    assert return_curves(recs, "apt")[0] == {1000: 20, 2000: 40, 3000: 60, 4000: 61, 5000: 60}
    text = finetune_report(recs, tmp_path)
    assert (tmp_path / "semdice_finetune_returns.png").exists()
    assert "| semdice | 50.0 ± 0.0 | 120.0 ± 0.0 |" in text
    rows = [line for line in text.splitlines() if line.startswith("| Fine-tuning") or line.startswith("| Pre-train")]
    assert len(rows) == 3 and all("**reproduced**" in r for r in rows)
    # a still-rising SEMDICE curve makes the final-return claims underfit, whatever the margin
    rising = [_ft("semdice", [50, 100, 150, 200, 300 + s], 300 + s) for s in (0, 1, 2)] + recs[3:]
    assert finetune_report(rising, tmp_path).count("**inconclusive: underfit**") == 2


def test_deep_report_judges_against_apt_and_the_data_policy(tmp_path):
    def rec(name, ent, cells, curve=True):
        c = {"val/cell_entropy": [(0, ent - 1), (8, ent), (10, ent)]} if curve else {}
        return _Rec(name, {"test/cell_entropy": ent, "test/cells": cells, "test/pbe": 0.1}, c)

    recs = [rec("semdice", 3.0 + s / 100, 27) for s in range(3)] + [rec("apt", 1.0 + s / 100, 8) for s in range(3)]
    recs += [rec("init", 1.5, 12, False) for _ in range(3)] + [rec("data", 2.0 + s / 50, 15, False) for s in range(3)]
    text = deep_report(recs, tmp_path)
    assert "| data |" in text and "| init |" in text
    assert text.count("**reproduced**") == 2 and "semdice_finetune.md" in text
    # the online APT (its paper's protocol) is judged on a row of its own, with its curve against env steps
    online = [rec("apt_online", 2.5 + s / 100, 20) for s in range(3)]
    for r in online:
        r.curves["val/env_steps"] = [(0, 1000.0), (8, 9000.0), (10, 11000.0)]
    text = deep_report(recs + online, tmp_path)
    assert "APT, online as its paper runs it" in text and text.count("**reproduced**") == 3
    assert "| 9000 | 2.510 ± 0.01 |" in text
    close = [rec("apt_online", 3.0 + s / 100, 27) for s in range(3)]  # as good as SEMDICE: not reproduced
    row = [line for line in deep_report(recs + close, tmp_path).splitlines() if "online as its paper" in line]
    assert len(row) == 1 and "**reproduced**" not in row[0]
