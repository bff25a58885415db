"""MDA's results hook (issue 48, item 3): the average claim is read from a bounded aggregate (mean rank over the
methods per metric), attention rollout is among the compared baselines, and the unbounded "+x%" is shown, not
judged. Synthetic records."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_modules.mda.evaluation import FAITHFULNESS, LOWER_IS_BETTER
from reports.mda import BASELINES, COMPARED, claim_report, gain_over_best, mean_ranks, rank_values
from suite.compare import RunRecord


def _records(tmp_path: Path, value) -> list[RunRecord]:
    """Three seeds; ``value(method, metric, seed)`` gives every attr value; a plateaued val/loss curve."""
    recs = []
    for seed in range(3):
        m = {"attr/n_images": 5.0, "test/acc": 0.8}
        for metric in FAITHFULNESS:
            for meth in ("mda", *COMPARED):
                v = value(meth, metric, seed)
                if v is not None:
                    m[f"attr/{meth}/{metric}"] = v
        curve = [(i, 0.5 - 0.001 * min(i, 5) + 0.0001 * seed) for i in range(10)]
        recs.append(RunRecord(tmp_path / str(seed), "subject", seed, m, {"val/loss": curve}))
    return recs


def _verdict_row(page: str) -> str:
    return next(line for line in page.splitlines() if line.startswith("| MDA outperforms"))


def test_rank_values_and_mean_ranks_by_hand(tmp_path: Path):
    assert rank_values({"a": 0.9, "b": 0.5, "c": 0.5, "d": 0.1}, higher_is_better=True) == {
        "a": 1.0, "b": 2.5, "c": 2.5, "d": 4.0,
    }  # fmt: skip
    assert rank_values({"a": 0.9, "b": 0.5}, higher_is_better=False) == {"a": 2.0, "b": 1.0}

    def value(meth, metric, seed):
        if meth not in ("mda", "tis", "rollout"):
            return None
        if metric == "rise_ins":  # mda best, rollout second, tis last
            return {"mda": 0.9, "rollout": 0.8, "tis": 0.1}[meth]
        if metric == "rise_del":  # lower is better: tis best, mda and rollout tie
            return {"mda": 0.5, "rollout": 0.5, "tis": 0.1}[meth]
        return None

    ranks = mean_ranks(_records(tmp_path, value), FAITHFULNESS)
    assert set(ranks) == {"mda", "tis", "rollout"}
    assert ranks["mda"] == [pytest.approx((1 + 2.5) / 2)] * 3
    assert ranks["rollout"] == [pytest.approx((2 + 2.5) / 2)] * 3
    assert ranks["tis"] == [pytest.approx((3 + 1) / 2)] * 3


def test_a_near_zero_metric_cannot_carry_the_average_claim(tmp_path: Path):
    """MDA is second on nine metrics and far ahead only on mono_neg, where the best baseline scores ~0: the
    unbounded mean relative gain is huge, but MDA's mean rank is worse than the best baseline's: not reproduced."""

    def value(meth, metric, seed):
        better = metric not in LOWER_IS_BETTER
        if metric == "mono_neg":
            return {"mda": 0.3 + 0.01 * seed, "tis": 0.001}.get(meth, 0.0005)
        best, mda, rest = (0.6, 0.58, 0.3) if better else (0.2, 0.21, 0.5)
        return {"tis": best + 0.001 * seed, "mda": mda + 0.001 * seed}.get(meth, rest)

    recs = _records(tmp_path, value)
    gains = gain_over_best(recs, FAITHFULNESS)
    assert min(gains) > 20  # +2000%: one metric near zero dominates the unbounded average
    ranks = mean_ranks(recs, FAITHFULNESS)
    assert ranks["mda"] == [pytest.approx(1.9)] * 3 and ranks["tis"] == [pytest.approx(1.1)] * 3
    row = _verdict_row(claim_report(recs, tmp_path))
    assert "**not reproduced**" in row, row
    assert "MDA 1.900 ± 0.000 vs the best-ranked baseline tis 1.100 ± 0.000" in row
    assert "beyond 2 s.e. on 1/10 metrics" in row and "not judged" in row.lower()


def test_attention_rollout_is_a_compared_baseline(tmp_path: Path):
    """The paper's seven are worse than MDA on every metric, rollout is better on every metric."""
    assert (*BASELINES, "rollout") == COMPARED

    def value(meth, metric, seed):
        lower = metric in LOWER_IS_BETTER
        v = {"rollout": 0.8, "mda": 0.7}.get(meth, 0.4) + 0.002 * seed
        return 1 - v if lower else v

    recs = _records(tmp_path, value)
    assert max(gain_over_best(recs, FAITHFULNESS)) < 0  # rollout is the best baseline on every metric
    page = claim_report(recs, tmp_path)
    assert "**not reproduced**" in _verdict_row(page) and "best-ranked baseline rollout" in _verdict_row(page)
    assert "| rollout | 0.802 ± 0.002" in page  # rollout's row in the metric table


def test_a_method_best_on_every_metric_is_reproduced(tmp_path: Path):
    def value(meth, metric, seed):
        lower = metric in LOWER_IS_BETTER
        v = {"mda": 0.8 + 0.001 * seed}.get(meth, 0.6 - 0.01 * COMPARED.index(meth) if meth in COMPARED else 0.0)
        return 1 - v if lower else v

    recs = _records(tmp_path, value)
    row = _verdict_row(claim_report(recs, tmp_path))
    assert "**reproduced**" in row and "MDA 1.000 ± 0.000" in row and "10/10 metrics" in row
