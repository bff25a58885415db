"""Results-page hook of the preworld claim (``report: reports.preworld:claim_report``).

PreWorld (semi-supervised vision-centric 3D occupancy world model, ICLR 2025). The spec declares the comparisons of
two entries (the semi-supervised gain over scratch, ego conditioning); this hook judges the ones that compare two
metrics of the same run, which the spec cannot declare: forecasting mIoU per horizon against copy-last warped by the
known ego poses, and planning by the ST-P3 metric (L2 and ego-box collisions averaged over the steps up to each
horizon) against the constant-velocity planner. Both baselines are scored on the same runs, samples and world as the
model (each seed builds its own world), so these are paired by seed.

The verdicts read the official conventions: the 4D mIoU unmasked (the official 4D evaluation), the current-frame mIoU
camera-masked (Occ3D), ST-P3's planning metric. The camera-masked 4D mIoU, the ground-truth copy-last (an upper
reference), the unwarped copy-last and the point form of collisions are tabulated beside them, not judged."""

from __future__ import annotations

import statistics
from pathlib import Path

from suite.claims import Claim, ClaimResult, ClaimSpec, HookResult, Table, judge_values, seed_values
from suite.compare import RunRecord
from suite.report import mean_sd

HORIZONS = (1, 2, 3)
MIN_COLLISION = 0.01  # collision rate of the constant-velocity planner below this: no collisions to avoid
ENTRIES = ("finetune", "scratch", "finetune_noego", "pretrain", "pretrain_noego")
MODEL = "finetune"


def _within_run(claim: Claim, records: list[RunRecord], unconverged: dict[str, str], absent: str | None = None):
    """``claim`` on two metrics of the fine-tuned model's runs (its ``metric`` reads ``<ours> vs <baseline>``; its
    ``entries`` name the two sides), paired by seed: the baseline is scored on the same world and samples."""
    ours, base = (seed_values(records, MODEL, k) for k in claim.metric.split(" vs "))
    return judge_values(claim, ours, base, paired=True, unconverged=unconverged, absent=absent)


def within_run_claims(records: list[RunRecord], unconverged: dict[str, str]) -> list[ClaimResult]:
    """Forecasting per horizon against the warped copy-last, planning L2 and collisions against constant velocity."""
    out = []
    for k in HORIZONS:
        claim = Claim(
            f"forecast_h{k}",
            f"Forecast occupancy at t+{k} beats copy-last warped by the known ego poses (mIoU, unmasked as the "
            "official 4D evaluation)",
            f"test/miou_h{k} vs test/miou_copy_last_h{k}",
            ("forecast", "copy-last"),
            True,
            delta=0.02,
            delta_why="2 mIoU points (the paper's forecasting gain at this scale was not recovered)",
        )
        out.append(_within_run(claim, records, unconverged))
    l2 = Claim(
        "plan_l2",
        "Planned waypoints are closer to the driven ones than constant velocity (ST-P3 L2, m, average of the horizons)",
        "test/l2 vs test/l2_cv",
        ("planner", "constant velocity"),
        False,
        delta=0.05,
        delta_why="0.05 m, an eighth of constant velocity's L2 in this world (~0.4 m)",
    )
    out.append(_within_run(l2, records, unconverged))
    col = Claim(
        "plan_col",
        "Planned waypoints collide less than constant velocity (ST-P3 ego-box collision rate, average of the horizons)",
        "test/col vs test/col_cv",
        ("planner", "constant velocity"),
        False,
        delta=0.01,
        delta_why="1 point of collision rate (constant velocity collides on ~5% of the steps here)",
    )
    cv = seed_values(records, MODEL, "test/col_cv")
    absent = None
    if cv and statistics.fmean(cv.values()) < MIN_COLLISION:
        absent = f"constant velocity collides on {statistics.fmean(cv.values()):.2%} of the steps: nothing to avoid"
    out.append(_within_run(col, records, unconverged, absent))
    return out


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
        cols += [(f"t+{k}", f"test/miou_h{k}"), (f"t+{k} masked", f"test/miou_masked_h{k}"),
                 (f"copy-last t+{k}", f"test/miou_copy_last_h{k}"), (f"GT copy t+{k}", f"test/miou_copy_last_gt_h{k}"),
                 (f"unwarped t+{k}", f"test/miou_copy_last_unwarped_h{k}")]  # fmt: skip
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
    cols += [("col avg", "test/col"), ("col CV avg", "test/col_cv"), ("point col avg", "test/col_point"),
             ("point col CV avg", "test/col_point_cv")]  # fmt: skip
    return _table(
        "Planning per horizon (test split, ST-P3, mean ± sd over seeds)",
        records,
        cols,
        "Horizon k averages steps 1..k (frames of the world; the paper's 1/2/3 s are 2/4/6 steps at 2 Hz); "
        "collisions: the 4.084 x 1.85 m ego box against the other agents' boxes, steps where the driven trajectory "
        "collides not counted; point col: the waypoint inside a non-drivable occupied column.",
    )


def claim_report(records: list[RunRecord], spec: ClaimSpec, out_dir: Path) -> HookResult:
    """The within-run verdicts (forecasting vs copy-last, planning vs constant velocity) and the per-horizon tables.

    Args:
        records: the claim's runs.
        spec: the preworld claim spec (its convergence rule judges the fine-tuned model).
        out_dir: the page's folder (unused: no figure).
    """
    ok, why = spec.convergence(records).get(MODEL, (False, "no run"))
    verdicts = within_run_claims(records, {} if ok else {MODEL: why})
    return HookResult(verdicts=verdicts, tables=[forecast_table(records), planning_table(records)])
