"""MDA's results hook: the average claim is read from a bounded aggregate (mean rank over the methods per metric,
paired by seed against the best-ranked baseline), attention rollout is among the compared baselines, and the
unbounded "+x%" is shown, not judged. Synthetic records."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_modules.mda.evaluation import FAITHFULNESS, LOWER_IS_BETTER
from reports.mda import BASELINES, COMPARED, gain_over_best, mean_ranks, rank_values
from suite import stats
from suite.claim import judge_page, load_spec
from suite.claims import ClaimSpec
from suite.compare import RunRecord


def _records(tmp_path: Path, value, *, converged: bool = True, metrics=FAITHFULNESS) -> list[RunRecord]:
    """One subject per seed (entries ``subject_s<seed>``, as the spec runs them); ``value(method, metric, seed)``
    gives every attr value; a val/loss curve flat over its last half, or still falling at the stop."""
    recs = []
    for seed in range(3):
        m = {"attr/n_images": 5.0, "test/acc": 0.8}
        for metric in metrics:
            for meth in ("mda", *COMPARED):
                v = value(meth, metric, seed)
                if v is not None:
                    m[f"attr/{meth}/{metric}"] = v
        curve = [(i, 0.5 - 0.01 * (min(i, 5) if converged else i) + 0.0001 * seed) for i in range(10)]
        recs.append(RunRecord(tmp_path / str(seed), f"subject_s{seed}", seed, m, {"val/loss": curve}))
    return recs


def page(tmp_path: Path, records: list[RunRecord]):
    """The mda page's verdicts by id and the hook's result."""
    verdicts, _, result, _, _, _ = judge_page(ClaimSpec.from_dict("mda", load_spec("mda")), records, tmp_path)
    return {v.id: v for v in verdicts}, result


def test_rank_values_and_mean_ranks_by_hand(tmp_path: Path):
    assert rank_values({"a": 0.9, "b": 0.5, "c": 0.5, "d": 0.1}, higher_is_better=True) == {
        "a": 1.0,
        "b": 2.5,
        "c": 2.5,
        "d": 4.0,
    }
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
    assert ranks["mda"] == {s: pytest.approx((1 + 2.5) / 2) for s in ("0", "1", "2")}
    assert list(ranks["rollout"].values()) == [pytest.approx((2 + 2.5) / 2)] * 3
    assert list(ranks["tis"].values()) == [pytest.approx((3 + 1) / 2)] * 3


def test_a_near_zero_metric_cannot_carry_the_average_claim(tmp_path: Path):
    """MDA is second on nine metrics and far ahead only on mono_neg, where the best baseline scores ~0: the
    unbounded mean relative gain is huge, but MDA's mean rank is worse than the best baseline's: not reproduced.
    On seed 2 another baseline edges out tis on mono_neg (tis third there): the paired rank differences spread."""

    def value(meth, metric, seed):
        better = metric not in LOWER_IS_BETTER
        if metric == "mono_neg":
            if meth == "vit_cx" and seed == 2:
                return 0.0015
            return {"mda": 0.3 + 0.01 * seed, "tis": 0.001}.get(meth, 0.0005)
        best, mda, rest = (0.6, 0.58, 0.3) if better else (0.2, 0.21, 0.5)
        # MDA's seeds also wobble of their own: each metric's paired difference spreads
        return {"tis": best + 0.001 * seed, "mda": mda + 0.001 * seed + 0.0005 * seed * seed}.get(meth, rest)

    recs = _records(tmp_path, value)
    assert min(gain_over_best(recs, FAITHFULNESS).values()) > 20  # +2000%: one metric near zero dominates
    by_id, result = page(tmp_path, recs)
    rank = by_id["mda_mean_rank"]
    assert rank.verdict == stats.NOT_REPRODUCED and rank.primary and rank.paired
    # lower rank = positive; tis ranks 1.1, 1.1, 1.2 over the seeds
    assert rank.entries == ("mda", "tis") and rank.diff == pytest.approx((1.1 + 1.1 + 1.2) / 3 - 1.9)
    assert rank.values["mda"] == {s: pytest.approx(1.9) for s in ("0", "1", "2")}
    assert "on 1/10 metrics" in rank.evidence and "not judged" in rank.evidence
    every = by_id["mda_every_metric"]
    assert every.verdict == stats.NOT_REPRODUCED and "worse on 9" in every.why
    per_metric = {row[0]: row for row in result.tables[1].rows}
    assert per_metric["mono_neg"][1] == "tis" and per_metric["mono_neg"][-1] == stats.REPRODUCED
    assert per_metric["rise_del"][-1] == stats.NOT_REPRODUCED  # lower is better: MDA's 0.21 loses to 0.2


def test_attention_rollout_is_a_compared_baseline(tmp_path: Path):
    """The paper's seven are worse than MDA on every metric (but one of them, on rise_ins of seed 2, so that MDA's
    rank spreads over the seeds), rollout is better on every metric."""
    assert (*BASELINES, "rollout") == COMPARED

    def value(meth, metric, seed):
        lower = metric in LOWER_IS_BETTER
        v = {"rollout": 0.8, "mda": 0.7 + 0.001 * seed * seed}.get(meth, 0.4) + 0.002 * seed
        if meth == BASELINES[0] and metric == "rise_ins" and seed == 2:
            v = 0.75  # between rollout and MDA: MDA third there
        return 1 - v if lower else v

    recs = _records(tmp_path, value, metrics=(*FAITHFULNESS, "pointing"))
    assert max(gain_over_best(recs, FAITHFULNESS).values()) < 0  # rollout is the best baseline on every metric
    by_id, result = page(tmp_path, recs)
    assert by_id["mda_mean_rank"].verdict == stats.NOT_REPRODUCED and by_id["mda_mean_rank"].entries[1] == "rollout"
    table = next(t for t in result.tables if t.title.startswith("Metrics MDA's search"))
    rollout = next(row for row in table.rows if row[0] == "rollout")
    assert rollout[1].startswith("0.802 ± 0.002")  # rollout's row in the metric table
    held = by_id["heldout_pointing"]  # a suite check beside the paper's claim
    assert held.verdict == stats.NOT_REPRODUCED and held.entries == ("mda", "rollout") and held.hi < 0


def test_a_method_best_on_every_metric_is_reproduced_unless_a_subject_is_underfit(tmp_path: Path):
    def value(meth, metric, seed):
        lower = metric in LOWER_IS_BETTER
        v = {"mda": 0.8 + 0.001 * seed}.get(meth, 0.6 - 0.01 * COMPARED.index(meth) if meth in COMPARED else 0.0)
        if meth == COMPARED[0] and metric == "rise_ins" and seed == 2:
            v -= 0.015  # the best baseline third on one metric of one seed: its mean rank spreads over the seeds
        return 1 - v if lower else v

    by_id, result = page(tmp_path, _records(tmp_path, value))
    rank = by_id["mda_mean_rank"]
    assert rank.verdict == stats.REPRODUCED and rank.values["mda"] == {s: 1.0 for s in ("0", "1", "2")}
    assert rank.lo > 0 and "on 10/10 metrics" in rank.evidence
    assert by_id["mda_every_metric"].verdict == stats.REPRODUCED
    assert any("mda_examples.png" in n for n in result.notes)  # no example grid in the run folders: said so
    by_id, _ = page(tmp_path, _records(tmp_path, value, converged=False))
    assert by_id["mda_mean_rank"].verdict == stats.UNDERFIT and by_id["mda_mean_rank"].lo > 0
    assert by_id["mda_every_metric"].verdict == stats.UNDERFIT
