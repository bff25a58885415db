"""SEMDICE hooks (tabular, deep, downstream): verdict objects of the declared and the hook-built claims, tables and
curves, on hand-made runs."""

from __future__ import annotations

from pathlib import Path

from reports.semdice import trajectory_curves
from reports.semdice_finetune import return_curves
from suite.claim import judge_page, load_spec
from suite.claims import ClaimSpec
from suite.compare import RunRecord
from suite.stats import NOISE, REPRODUCED, UNDERFIT


def _rec(name, seed, metrics, curves):
    return RunRecord(Path(name), name, seed, metrics, curves, {"data": {"seed": seed}})


def _judge(slug, records, tmp_path):
    spec = ClaimSpec.from_dict(slug, load_spec(slug))
    verdicts, weak_notes, result, hook_md, _, _ = judge_page(spec, records, tmp_path)
    assert hook_md == ""  # the hook returns data, never markdown
    return {v.id: v for v in verdicts}, result, weak_notes


def _ft(name, seed, levels, final):
    steps = [(i, 1000.0 * (i + 1)) for i in range(len(levels))]
    return _rec(name, seed, {"test/return": final}, {"val/return": list(enumerate(levels)), "val/env_steps": steps})


def test_finetune_claims_curves_and_area(tmp_path):
    recs = [_ft("semdice", s, [50, 120, 150, 150 + s, 151], 151 + s) for s in (0, 1, 2)]
    # converged under evaluate: last: no seed ends more than 1% below its best (the final weights are scored); the
    # areas differ from SEMDICE's by a seed-dependent amount
    recs += [_ft("apt", s, [20, 40, 60, 60.5, 60 + s / 2], 60 + 2 * s) for s in (0, 1, 2)]
    recs += [_ft("scratch", s, [10, 20, 30 + s / 2, 31, 31], 31 + s * s) for s in (0, 1, 2)]
    assert return_curves(recs, "apt")["1"] == {1000: 20, 2000: 40, 3000: 60, 4000: 60.5, 5000: 60.5}
    by_id, result, _ = _judge("semdice_finetune", recs, tmp_path)
    assert (tmp_path / "semdice_finetune_returns.png").exists() and result.figures
    apt = by_id["semdice_vs_apt"]
    assert apt.verdict == REPRODUCED and apt.primary and apt.paired and apt.diff == 90 and apt.lo > 5
    assert by_id["semdice_vs_scratch"].verdict == REPRODUCED and not by_id["semdice_vs_scratch"].primary
    assert by_id["semdice_vs_apt_offline"].n == (3, 0)  # no runs of apt_offline: kept, with its reason
    assert by_id["semdice_on_apt_vs_apt"].n == (0, 3)  # no runs of semdice_on_apt: kept, with its reason
    area = by_id["faster_than_scratch"]
    assert area.verdict == REPRODUCED and area.values["semdice"]["0"] == (50 + 120 + 150 + 150 + 151) / 5
    assert result.tables[0].rows[0][:2] == ["semdice", "50 ± 0 (n=3)"]
    # a still-rising SEMDICE curve makes the final-return claims underfit, whatever the margin; not the area claim
    rising = [_ft("semdice", s, [50, 100, 150, 200, 300 + s], 300 + s) for s in (0, 1, 2)] + recs[3:]
    by_id, _, _ = _judge("semdice_finetune", rising, tmp_path)
    assert by_id["semdice_vs_apt"].verdict == by_id["semdice_vs_scratch"].verdict == UNDERFIT
    assert by_id["faster_than_scratch"].verdict == REPRODUCED


def _deep(name, seed, ent, cells, curve=True):
    c = {"val/cell_entropy": [(0, ent - 1), (8, ent), (10, ent)]} if curve else {}
    return _rec(name, seed, {"test/cell_entropy": ent, "test/cells": cells, "test/pbe": 0.1}, c)


def test_deep_claims_against_apt_and_the_data_policy(tmp_path):
    recs = [_deep("semdice", s, 3.0 + s / 100 + 0.003 * s * s, 27) for s in range(3)]  # paired differences spread
    recs += [_deep("apt", s, 2.0 + s / 50, 8) for s in range(3)]
    recs += [_deep("init", s, 1.5, 12, False) for s in range(3)]
    recs += [_deep("data", s, [2.0, 3.3, 3.5][s], 15, False) for s in range(3)]  # untrained floor: no curve needed
    online = [_deep("apt_online", s, 2.5 + s / 100, 20) for s in range(3)]
    for r in online:
        r.curves["val/env_steps"] = [(0, 1000.0), (8, 9000.0), (10, 11000.0)]
    on_apt = [_deep("semdice_on_apt", s, 2.9 + s / 100 + 0.002 * s * s, 25) for s in range(3)]
    by_id, result, _ = _judge("semdice_deep", recs + online + on_apt, tmp_path)
    same_data = by_id["semdice_on_apt_vs_apt_online"]
    assert same_data.verdict == REPRODUCED and same_data.primary and same_data.paired
    assert by_id["semdice_vs_apt_online"].verdict == REPRODUCED and not by_id["semdice_vs_apt_online"].primary
    assert by_id["semdice_vs_apt_offline"].verdict == REPRODUCED
    assert by_id["semdice_vs_behaviour"].verdict == NOISE and by_id["semdice_vs_behaviour"].lo < 0
    coverage = result.tables[0]
    assert [r[0] for r in coverage.rows] == ["semdice_on_apt", "apt_online", "semdice", "apt", "init", "data"]
    curve = next(t for t in result.tables if t.title.startswith("Curve of APT online"))
    assert curve.rows[1] == ["9000", "2.510 ± 0.01"]
    assert "semdice_finetune.md" in result.notes[0]
    close = [_deep("apt_online", s, 3.0 + s / 100, 27) for s in range(3)]  # as good as SEMDICE: not reproduced
    by_id, _, _ = _judge("semdice_deep", recs + close + on_apt, tmp_path)
    assert by_id["semdice_vs_apt_online"].verdict != REPRODUCED
    assert by_id["semdice_on_apt_vs_apt_online"].verdict != REPRODUCED


def _tab(name, seed, final, rise=1.0, gap=None):
    xs = [10, 20, 50, 100, 200, 500, 1000]
    ys = [final * min(1.0, (i + 1) / (len(xs) * rise)) for i in range(len(xs))]
    m = {"test/normalized_entropy": final + 0.01 * seed}
    if gap is not None:
        m["test/recovery_gap"] = gap
    curves = {"val/trajectories": list(enumerate(xs)), "val/normalized_entropy": list(enumerate(ys))}
    return _rec(name, seed, m, curves)


def test_tabular_claims_against_the_best_baseline(tmp_path):
    recs = [_tab("semdice", s, 0.97, rise=0.5, gap=0.001) for s in range(3)]
    recs += [_tab("pb_s", s, [0.50, 0.62, 0.70][s]) for s in range(3)]
    recs += [_tab("cb_s", s, [0.60, 0.66, 0.68][s]) for s in range(3)]  # best by its mean: the comparator
    recs += [_tab("uniform", s, 0.0) for s in range(3)]
    assert trajectory_curves(recs, "semdice")["0"][1000] == 0.97
    by_id, result, _ = _judge("semdice", recs, tmp_path)
    final, fast = by_id["final_vs_best_baseline"], by_id["faster_than_best_baseline"]
    assert final.entries == ("semdice", "cb_s") and final.verdict == REPRODUCED and final.primary and final.paired
    assert fast.verdict == REPRODUCED and fast.primary and fast.p_holm is not None
    assert by_id["single_stationary_policy"].verdict == REPRODUCED
    assert [r[0] for r in result.tables[0].rows] == ["semdice", "uniform", "pb_s", "cb_s"]
    recs[:3] = [_tab("semdice", s, 0.97, gap=0.2) for s in range(3)]  # the dual did not recover d^pi
    by_id, _, _ = _judge("semdice", recs, tmp_path)  # and SEMDICE's curve still rising at the end
    assert by_id["single_stationary_policy"].verdict == UNDERFIT
    assert by_id["final_vs_best_baseline"].verdict == UNDERFIT and "semdice" in by_id["final_vs_best_baseline"].why
    assert by_id["faster_than_best_baseline"].verdict == REPRODUCED  # how fast: read whatever the end
