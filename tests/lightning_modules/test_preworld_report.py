"""The preworld results page reads its verdicts off the official metrics (unmasked 4D mIoU, ST-P3 L2 and box
collisions) against the warped copy-last and constant velocity, paired by seed, and tabulates every horizon."""

from __future__ import annotations

from pathlib import Path

import pytest

from suite import stats
from suite.claim import judge_page, load_spec
from suite.claims import ClaimSpec
from suite.compare import RunRecord


def _records(*, col_cv: float = 0.1, finetune_miou: float = 0.6, rising: tuple[str, ...] = ()) -> list[RunRecord]:
    """Three seeds whose worlds differ (a shared per-seed offset ``jitter`` on every metric of a seed) and whose
    fine-tuned model wobbles a little of its own (``own``, mean 0): paired differences are nearly exact where a Welch
    interval would straddle 0."""
    out = []
    for seed, (jitter, own) in enumerate(((-0.05, 0.0), (0.0, 0.004), (0.05, -0.004))):
        m = {"test/miou": 0.5 + jitter, "test/iou": 0.8, "test/miou_forecast": 0.5 + jitter + own}
        for k in (1, 2, 3):
            m |= {
                f"test/miou_h{k}": 0.5 + jitter + own,
                f"test/miou_copy_last_h{k}": 0.47 + jitter,
                f"test/miou_masked_h{k}": 0.3 + jitter,
                f"test/miou_copy_last_masked_h{k}": 0.45 + jitter,
                f"test/miou_copy_last_gt_h{k}": 0.7,
                f"test/miou_copy_last_unwarped_h{k}": 0.2,
                f"test/l2_h{k}": 0.1 * k + jitter,
                f"test/l2_cv_h{k}": 0.3 * k + jitter,
                f"test/col_h{k}": 0.01 * k,
                f"test/col_cv_h{k}": 0.05 * k + jitter,
            }
        m |= {
            "test/l2": 0.2 + jitter + own,
            "test/l2_cv": 0.6 + jitter,
            "test/col": 0.02,
            "test/col_cv": col_cv + jitter / 10,
            "test/col_point": 0.0,
            "test/col_point_cv": 0.004,
        }
        for name in ("finetune", "scratch", "finetune_noego", "pretrain"):
            mm = dict(m)
            if name == "finetune":
                mm["test/miou"] = finetune_miou + jitter + own
            else:
                mm["test/miou_forecast"] = 0.4 + jitter
            curve = [(i, 1.0 - 0.1 * i) for i in range(10)] if name in rising else [(0, 2.0), (5, 1.0), (9, 1.0)]
            out.append(RunRecord(Path(f"/runs/{name}/{seed}"), name, seed, mm, {"val/loss": curve}))
    return out


def _page(tmp_path: Path, records: list[RunRecord]):
    spec = ClaimSpec.from_dict("preworld", load_spec("preworld"))
    verdicts, _, result, _, _, _ = judge_page(spec, records, tmp_path)
    return {v.id: v for v in verdicts}, result


def test_verdicts_read_the_official_metrics_paired_by_seed(tmp_path: Path):
    by_id, result = _page(tmp_path, _records())
    # forecasting judged unmasked (0.5 vs 0.47: about 0.03 on every seed's world) although the masked numbers
    # (0.3 vs 0.45) would say otherwise; the seeds' worlds differ by 0.1, so only the pairing decides it
    for k in (1, 2, 3):
        f = by_id[f"forecast_h{k}"]
        assert f.verdict == stats.REPRODUCED and f.paired and f.diff == pytest.approx(0.03), f
    # collisions judged by the ST-P3 box rate (0.1 for constant velocity), not the point form (0.004)
    assert by_id["plan_col"].verdict == stats.REPRODUCED and by_id["plan_col"].diff == pytest.approx(0.08)
    assert by_id["plan_l2"].verdict == stats.REPRODUCED and by_id["plan_l2"].diff == pytest.approx(0.4)
    assert by_id["semi_supervised"].verdict == stats.REPRODUCED and by_id["semi_supervised"].primary
    assert by_id["semi_supervised"].paired and by_id["ego_conditioning"].verdict == stats.REPRODUCED
    # per-horizon tables: every horizon of L2 and collisions, model beside constant velocity, and the baselines
    columns = [c for t in result.tables for c in t.columns]
    for head in (
        "L2 1",
        "L2 CV 3",
        "col 2",
        "col CV 3",
        "point col avg",
        "copy-last t+3",
        "GT copy t+1",
        "unwarped t+2",
        "t+1 masked",
    ):
        assert head in columns, head


def test_no_collisions_to_avoid_and_underfit_stages(tmp_path: Path):
    by_id, _ = _page(tmp_path, _records(col_cv=0.004))
    assert by_id["plan_col"].verdict == stats.ABSENT and "nothing to avoid" in by_id["plan_col"].why
    # no gain from pre-training: the same mIoU as scratch, within a few thousandths on every seed
    by_id, _ = _page(tmp_path, _records(finetune_miou=0.5))
    assert by_id["semi_supervised"].verdict == stats.NOT_REPRODUCED and "delta" in by_id["semi_supervised"].why
    # a pre-training stage still improving makes the semi-supervised verdict underfit, not the forecasting ones
    by_id, _ = _page(tmp_path, _records(rising=("pretrain",)))
    assert by_id["semi_supervised"].verdict == stats.UNDERFIT and by_id["forecast_h1"].verdict == stats.REPRODUCED
    by_id, _ = _page(tmp_path, _records(rising=("finetune",)))
    assert by_id["forecast_h2"].verdict == stats.UNDERFIT and by_id["plan_l2"].verdict == stats.UNDERFIT
