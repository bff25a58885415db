"""Results-page hook of the preworld claim (``report: reports.preworld:claim_report``): the semi-supervised gain,
forecasting mIoU per horizon against the standard copy-last (warped by the known ego poses) and against no ego
conditioning, planning by the ST-P3 metric (L2 and ego-box collisions averaged over the steps up to each horizon)
against the constant-velocity planner, with one computed verdict per claim.

The verdicts read the official conventions: the 4D mIoU unmasked (the official 4D evaluation), the current-frame mIoU
camera-masked (Occ3D), ST-P3's planning metric. The camera-masked 4D mIoU, the ground-truth copy-last (an upper
reference), the unwarped copy-last (the suite's former baseline) and the point form of collisions are shown beside
them, not judged."""

from __future__ import annotations

import statistics
from typing import Any

from suite.report import ABSENT, UNDERFIT, Verdict, compare, mean_sd, sizing, sizing_spec, values, verdict_table

HORIZONS = (1, 2, 3)
MIN_COLLISION = 0.01  # collision rate of the constant-velocity planner below this: no collisions to avoid
ENTRIES = ("finetune", "scratch", "finetune_noego", "pretrain", "pretrain_noego")


def _verdict(ours: list[float], base: list[float], hib: bool, converged: bool) -> str:
    if not ours or not base:
        return UNDERFIT
    return compare(ours, base, higher_is_better=hib, converged=converged)


def _table(records: list[Any], columns: list[tuple[str, str]]) -> str:
    rows = ["| entry | " + " | ".join(title for title, _ in columns) + " |", "|---|" + "---|" * len(columns)]
    for name in ENTRIES:
        if not values(records, name, "test/miou"):
            continue
        rows.append(f"| {name} | " + " | ".join(mean_sd(values(records, name, key)) for _, key in columns) + " |")
    return "\n".join(rows)


def forecast_table(records: list[Any]) -> str:
    """mIoU per horizon: the model unmasked (official) and masked, copy-last warped (standard), ground-truth
    copy-last (upper reference) and unwarped (former baseline)."""
    cols = []
    for k in HORIZONS:
        cols += [(f"t+{k}", f"test/miou_h{k}"), (f"t+{k} masked", f"test/miou_masked_h{k}"),
                 (f"copy-last t+{k}", f"test/miou_copy_last_h{k}"), (f"GT copy t+{k}", f"test/miou_copy_last_gt_h{k}"),
                 (f"unwarped t+{k}", f"test/miou_copy_last_unwarped_h{k}")]  # fmt: skip
    return _table(records, cols)


def planning_table(records: list[Any]) -> str:
    """ST-P3 L2 and box collisions per horizon (mean over steps 1..k) and their average, model beside constant
    velocity; the point form of collisions last."""
    cols = []
    for k in HORIZONS:
        cols += [(f"L2 {k}", f"test/l2_h{k}"), (f"L2 CV {k}", f"test/l2_cv_h{k}")]
    cols += [("L2 avg", "test/l2"), ("L2 CV avg", "test/l2_cv")]
    for k in HORIZONS:
        cols += [(f"col {k}", f"test/col_h{k}"), (f"col CV {k}", f"test/col_cv_h{k}")]
    cols += [("col avg", "test/col"), ("col CV avg", "test/col_cv"), ("point col avg", "test/col_point"),
             ("point col CV avg", "test/col_point_cv")]  # fmt: skip
    return _table(records, cols)


def claim_report(records: list[Any], out_dir: Any, spec: dict | None = None) -> str:
    metric, hib = sizing_spec(spec or "preworld")
    judged = sizing(records, metric or "val/loss", higher_is_better=hib)
    done = lambda *names: all(judged.get(n, (False, ""))[0] for n in names)  # noqa: E731
    verdicts = []
    ft, sc = values(records, "finetune", "test/miou"), values(records, "scratch", "test/miou")
    verdicts.append(Verdict(
        "Pre-training by rendering 2D labels, then fine-tuning on 10% of scenes with 3D labels, beats training "
        "from scratch on the same 10% (mIoU, camera-masked as Occ3D)",
        _verdict(ft, sc, True, done("pretrain", "finetune", "scratch")),
        f"mIoU {mean_sd(ft)} vs {mean_sd(sc)} (IoU {mean_sd(values(records, 'finetune', 'test/iou'))} vs "
        f"{mean_sd(values(records, 'scratch', 'test/iou'))})",
    ))  # fmt: skip
    for k in HORIZONS:
        ours = values(records, "finetune", f"test/miou_h{k}")
        copy = values(records, "finetune", f"test/miou_copy_last_h{k}")
        verdicts.append(Verdict(
            f"Forecast occupancy at t+{k} beats copy-last warped by the known ego poses (mIoU, unmasked as the "
            "official 4D evaluation)",
            _verdict(ours, copy, True, done("finetune")),
            f"{mean_sd(ours)} vs copy-last {mean_sd(copy)} (ground-truth copy-last "
            f"{mean_sd(values(records, 'finetune', f'test/miou_copy_last_gt_h{k}'))})",
        ))  # fmt: skip
    fo, fn = values(records, "finetune", "test/miou_forecast"), values(records, "finetune_noego", "test/miou_forecast")
    verdicts.append(Verdict("Ego-state conditioning improves forecasting (mean unmasked mIoU over t+1..t+3)",
                            _verdict(fo, fn, True, done("finetune", "finetune_noego")),
                            f"{mean_sd(fo)} vs without ego state {mean_sd(fn)}"))  # fmt: skip
    l2, cv = values(records, "finetune", "test/l2"), values(records, "finetune", "test/l2_cv")
    per_h = ", ".join(
        f"{k}: {mean_sd(values(records, 'finetune', f'test/l2_h{k}'))} vs "
        f"{mean_sd(values(records, 'finetune', f'test/l2_cv_h{k}'))}"
        for k in HORIZONS
    )
    verdicts.append(Verdict("Planned waypoints are closer to the driven ones than constant velocity (ST-P3 L2, m, "
                            "average of the horizons)", _verdict(l2, cv, False, done("finetune")),
                            f"L2 {mean_sd(l2)} vs CV {mean_sd(cv)} (per horizon {per_h})"))  # fmt: skip
    col, col_cv = values(records, "finetune", "test/col"), values(records, "finetune", "test/col_cv")
    v = _verdict(col, col_cv, False, done("finetune"))
    if col_cv and v != UNDERFIT and statistics.fmean(col_cv) < MIN_COLLISION:
        v = ABSENT
    verdicts.append(Verdict("Planned waypoints collide less than constant velocity (ST-P3 ego-box collision rate, "
                            "average of the horizons)", v, f"{mean_sd(col)} vs CV {mean_sd(col_cv)}"))  # fmt: skip
    plateau_lines = "\n".join(
        f"- {n}: {'plateaued' if ok else 'not plateaued'} ({why})" for n, (ok, why) in judged.items()
    )
    return "\n\n".join([
        "## Verdicts", verdict_table(verdicts),
        "## Forecasting per horizon (test split, mIoU, mean ± sd over seeds)\n\n"
        "Unmasked (the official 4D evaluation) unless marked masked (camera-visible voxels). copy-last: the "
        "current prediction warped into each future ego frame by the known poses (the standard baseline); GT copy: "
        "the same with the ground-truth current occupancy (an upper reference); unwarped: the current prediction "
        "copied as is (the suite's former baseline).", forecast_table(records),
        "## Planning per horizon (test split, ST-P3, mean ± sd over seeds)\n\n"
        "Horizon k averages steps 1..k (frames of the world; the paper's 1/2/3 s are 2/4/6 steps at 2 Hz); "
        "collisions: the 4.084 x 1.85 m ego box against the other agents' boxes, steps where the driven "
        "trajectory collides not counted; point col: the waypoint inside a non-drivable occupied column.",
        planning_table(records),
        f"## Convergence ({metric})", plateau_lines,
    ])  # fmt: skip
