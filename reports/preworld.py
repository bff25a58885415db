"""Results-page hook of the preworld claim (``report: reports.preworld:claim_report``).

PreWorld (semi-supervised vision-centric 3D occupancy world model, ICLR 2025). The spec declares every claim,
including those that compare two metrics of the fine-tuned model's runs (forecasting mIoU per horizon against
copy-last warped by the known ego poses; planning by the ST-P3 metric against the constant-velocity planner). This
hook marks the collision claim's phenomenon absent when constant velocity hardly collides, and tabulates what the
verdicts do not read: the camera-masked 4D mIoU, the ground-truth copy-last (an upper reference), the unwarped
copy-last, every horizon of L2 and collisions, and the point form of collisions."""

from __future__ import annotations

import statistics
from pathlib import Path

from suite.claims import ClaimSpec, HookResult, Table, seed_values
from suite.compare import RunRecord
from suite.report import mean_sd

HORIZONS = (1, 2, 3)
MIN_COLLISION = 0.01  # collision rate of the constant-velocity planner below this: no collisions to avoid
ENTRIES = ("finetune", "scratch", "finetune_noego", "pretrain", "pretrain_noego")
MODEL = "finetune"


def collisions_absent(records: list[RunRecord]) -> dict[str, str]:
    """``{"plan_col": why}`` when constant velocity collides on under :data:`MIN_COLLISION` of the steps (mean over
    the fine-tuned model's seeds): with no collisions to avoid, fewer collisions is no test of the planner."""
    cv = seed_values(records, MODEL, "test/col_cv")
    if cv and (rate := statistics.fmean(cv.values())) < MIN_COLLISION:
        return {"plan_col": f"constant velocity collides on {rate:.2%} of the steps: nothing to avoid"}
    return {}


def _table(title: str, records: list[RunRecord], columns: list[tuple[str, str]], note: str) -> Table:
    rows = [
        [name, *(mean_sd(seed_values(records, name, key).values()) for _, key in columns)]
        for name in ENTRIES
        if seed_values(records, name, "test/miou")
    ]
    return Table(title, ["entry", *(title for title, _ in columns)], rows, note)


def forecast_table(records: list[RunRecord]) -> Table:
    """mIoU per horizon: the model unmasked (official) and masked, copy-last warped (standard), ground-truth
    copy-last (upper reference) and unwarped."""
    cols = []
    for k in HORIZONS:
        cols += [
            (f"t+{k}", f"test/miou_h{k}"),
            (f"t+{k} masked", f"test/miou_masked_h{k}"),
            (f"copy-last t+{k}", f"test/miou_copy_last_h{k}"),
            (f"GT copy t+{k}", f"test/miou_copy_last_gt_h{k}"),
            (f"unwarped t+{k}", f"test/miou_copy_last_unwarped_h{k}"),
        ]
    return _table(
        "Forecasting per horizon (test split, mIoU, mean ± sd over seeds)",
        records,
        cols,
        "Unmasked (the official 4D evaluation) unless marked masked (camera-visible voxels). copy-last: the current "
        "prediction warped into each future ego frame by the known poses (the standard baseline); GT copy: the same "
        "with the ground-truth current occupancy (an upper reference); unwarped: the current prediction copied as is.",
    )


def planning_table(records: list[RunRecord]) -> Table:
    """ST-P3 L2 and box collisions per horizon (mean over steps 1..k) and their average, model beside constant
    velocity; the point form of collisions last."""
    cols = []
    for k in HORIZONS:
        cols += [(f"L2 {k}", f"test/l2_h{k}"), (f"L2 CV {k}", f"test/l2_cv_h{k}")]
    cols += [("L2 avg", "test/l2"), ("L2 CV avg", "test/l2_cv")]
    for k in HORIZONS:
        cols += [(f"col {k}", f"test/col_h{k}"), (f"col CV {k}", f"test/col_cv_h{k}")]
    cols += [
        ("col avg", "test/col"),
        ("col CV avg", "test/col_cv"),
        ("point col avg", "test/col_point"),
        ("point col CV avg", "test/col_point_cv"),
    ]
    return _table(
        "Planning per horizon (test split, ST-P3, mean ± sd over seeds)",
        records,
        cols,
        "Horizon k averages steps 1..k (frames of the world; the paper's 1/2/3 s are 2/4/6 steps at 2 Hz); "
        "collisions: the 4.084 x 1.85 m ego box against the other agents' boxes, steps where the driven trajectory "
        "collides not counted; point col: the waypoint inside a non-drivable occupied column.",
    )


def claim_report(records: list[RunRecord], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """The collision claim's phenomenon gate and the per-horizon tables (every verdict is declared in the spec).

    Args:
        records: the claim's runs.
        spec: the preworld claim spec (unused: its claims are judged by the engine).
        out_dir: the page's folder (unused: no figure).
    """
    return HookResult(absent=collisions_absent(records), tables=[forecast_table(records), planning_table(records)])
