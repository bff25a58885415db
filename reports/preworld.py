"""Results-page hook of the preworld claim (``report: reports.preworld:claim_report``): the semi-supervised gain,
forecasting mIoU per horizon against copy-last-frame and against no ego conditioning, planning L2 and collisions
against the constant-velocity planner, with one computed verdict per claim."""

from __future__ import annotations

import statistics
from typing import Any

from suite.report import ABSENT, UNDERFIT, Verdict, compare, mean_sd, sizing, sizing_spec, values, verdict_table

HORIZONS = (1, 2, 3)
MIN_COLLISION = 0.01  # collision rate of the constant-velocity planner below this: no collisions to avoid


def _verdict(ours: list[float], base: list[float], hib: bool, converged: bool) -> str:
    if not ours or not base:
        return UNDERFIT
    return compare(ours, base, higher_is_better=hib, converged=converged)


def _horizon_table(records: list[Any]) -> str:
    rows = ["| entry | " + " | ".join(f"mIoU t+{k} | copy-last t+{k}" for k in HORIZONS) + " | L2 | L2 (CV) |",
            "|---|" + "---|" * (2 * len(HORIZONS) + 2)]  # fmt: skip
    for name in ("finetune", "scratch", "finetune_noego", "pretrain", "pretrain_noego"):
        if not values(records, name, "test/miou"):
            continue
        cells = []
        for k in HORIZONS:
            cells += [mean_sd(values(records, name, f"test/miou_h{k}")),
                      mean_sd(values(records, name, f"test/miou_copy_last_h{k}"))]  # fmt: skip
        cells += [mean_sd(values(records, name, "test/l2")), mean_sd(values(records, name, "test/l2_cv"))]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def claim_report(records: list[Any], out_dir: Any, spec: dict | None = None) -> str:
    metric, hib = sizing_spec(spec or "preworld")
    judged = sizing(records, metric or "val/loss", higher_is_better=hib)
    done = lambda *names: all(judged.get(n, (False, ""))[0] for n in names)  # noqa: E731
    verdicts = []
    ft, sc = values(records, "finetune", "test/miou"), values(records, "scratch", "test/miou")
    verdicts.append(Verdict(
        "Pre-training by rendering 2D labels, then fine-tuning on 10% of scenes with 3D labels, beats training "
        "from scratch on the same 10% (mIoU)",
        _verdict(ft, sc, True, done("pretrain", "finetune", "scratch")),
        f"mIoU {mean_sd(ft)} vs {mean_sd(sc)} (IoU {mean_sd(values(records, 'finetune', 'test/iou'))} vs "
        f"{mean_sd(values(records, 'scratch', 'test/iou'))})",
    ))  # fmt: skip
    for k in HORIZONS:
        ours = values(records, "finetune", f"test/miou_h{k}")
        copy = values(records, "finetune", f"test/miou_copy_last_h{k}")
        verdicts.append(Verdict(f"Forecast occupancy at t+{k} beats copying the current frame (mIoU)",
                                _verdict(ours, copy, True, done("finetune")),
                                f"{mean_sd(ours)} vs copy-last {mean_sd(copy)}"))  # fmt: skip
    fo, fn = values(records, "finetune", "test/miou_forecast"), values(records, "finetune_noego", "test/miou_forecast")
    verdicts.append(Verdict("Ego-state conditioning improves forecasting (mean mIoU over t+1..t+3)",
                            _verdict(fo, fn, True, done("finetune", "finetune_noego")),
                            f"{mean_sd(fo)} vs without ego state {mean_sd(fn)}"))  # fmt: skip
    l2, cv = values(records, "finetune", "test/l2"), values(records, "finetune", "test/l2_cv")
    verdicts.append(
        Verdict(
            "Planned waypoints are closer to the driven ones than constant velocity (L2, m)",
            _verdict(l2, cv, False, done("finetune")),
            f"L2 {mean_sd(l2)} vs CV {mean_sd(cv)}",
        )
    )
    col, col_cv = values(records, "finetune", "test/col"), values(records, "finetune", "test/col_cv")
    v = _verdict(col, col_cv, False, done("finetune"))
    if col_cv and v != UNDERFIT and statistics.fmean(col_cv) < MIN_COLLISION:
        v = ABSENT
    verdicts.append(Verdict("Planned waypoints collide less than constant velocity (collision rate)", v,
                            f"{mean_sd(col)} vs CV {mean_sd(col_cv)}"))  # fmt: skip
    plateau_lines = "\n".join(
        f"- {n}: {'plateaued' if ok else 'not plateaued'} ({why})" for n, (ok, why) in judged.items()
    )
    return "\n\n".join([
        "## Verdicts", verdict_table(verdicts),
        "## Forecasting and planning per horizon (test split, mean ± sd over seeds)", _horizon_table(records),
        f"## Convergence ({metric})", plateau_lines,
    ])  # fmt: skip
