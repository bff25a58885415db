"""SuMi: the declared claims (two metrics of the wild runs, paired by seed) and reports/sumi.py's stability verdicts,
the per-modality source table, unimodal assistance judged `phenomenon absent` when its mask removes (almost) no sample
from SuMi's selected set, and the 4x check."""

from __future__ import annotations

from pathlib import Path

from suite.claim import judge_page, load_spec
from suite.claims import ClaimSpec
from suite.compare import RunRecord

SPEC = ClaimSpec.from_dict("sumi", load_spec("sumi"))


def _records(tmp_path: Path, unimodal_gap: float) -> list[RunRecord]:
    out = []
    for seed in range(3):
        j = 0.004 * seed * seed  # seed levels differ; the paired gaps vary a little too
        metrics = {"val/acc": 0.95 + j, "val/acc_audio": 0.84 + j, "val/acc_video": 0.72 + j}
        for name, acc, sel in [
            ("tent", 0.60, 1.0),
            ("eata", 0.61, 0.45),
            ("sar", 0.60, 0.7),
            ("sumi", 0.66, 0.40),
            ("sumi_no_unimodal", 0.62, 0.40 + unimodal_gap),
            ("sumi_no_mi", 0.63, 0.40),
            ("sumi_no_iqr", 0.64, 0.55),
        ]:
            e = 0.001 * seed * (name == "sumi")
            metrics |= {
                f"tta/{name}/acc": acc + j + e,
                f"tta/{name}/selected": sel,
                f"tta/{name}/acc_q1": acc,
                f"tta/{name}/acc_q4": acc - 0.05 * (name == "tent") + e,
            }
        curve = {"val/acc": [(i, min(0.95 + j, 0.5 + 0.1 * i)) for i in range(16)]}  # converged
        out.append(RunRecord(tmp_path, "wild", seed, metrics, curve, config={"data": {"seed": seed}}))
    return out


def _judge(records: list[RunRecord], tmp_path: Path) -> tuple[dict, object]:
    verdicts, _, result, *_ = judge_page(SPEC, records, tmp_path)
    return {v.id: v for v in verdicts}, result


def test_unimodal_assistance_needs_its_mask_to_bind(tmp_path: Path):
    by_id, result = _judge(_records(tmp_path, unimodal_gap=0.05), tmp_path)
    tent = by_id["sumi_vs_tent"]
    assert tent.verdict == "reproduced" and tent.paired and tent.primary and tent.n == (3, 3)
    assert abs(tent.diff - 0.061) < 1e-9 and tent.p_holm is not None  # Holm across the three primaries
    assert set(tent.values) == {"wild:tta/sumi/acc", "wild:tta/tent/acc"}  # declared: two metrics of one entry
    assert by_id["sumi_vs_tent_stability"].verdict == "reproduced"  # tent loses 5 points by Q4, SuMi none
    assert by_id["sumi_vs_eata_stability"].verdict == "not reproduced"  # no effect as large as 1 point
    unimodal = by_id["sumi_vs_no_unimodal"]
    assert unimodal.verdict == "reproduced" and "removed 5.0% of the stream" in unimodal.evidence
    source = result.tables[0]
    assert source.rows[0] == ["wild", "95.7 ± 0.8", "84.7 ± 0.8", "72.7 ± 0.8"]  # per modality
    by_id, _ = _judge(_records(tmp_path, unimodal_gap=0.002), tmp_path)  # same samples: nothing was tested
    assert by_id["sumi_vs_no_unimodal"].verdict == "inconclusive: phenomenon absent"
    assert by_id["sumi_vs_no_mi"].verdict == "reproduced"


def _with_long(tmp_path: Path, val_gain: float, test_gain: float) -> list[RunRecord]:
    """The three seeds plus seed 0's 4x run, whose source model gains ``val_gain`` / ``test_gain`` over seed 0 and
    whose adapted variants score far from the main runs (so that leaking it into the pairs would show)."""
    records = _records(tmp_path, unimodal_gap=0.05)
    for r in records:
        r.metrics["test/acc"] = 0.55 + 0.02 * r.seed
    metrics = dict(records[0].metrics)
    metrics |= {"val/acc": metrics["val/acc"] + val_gain, "test/acc": metrics["test/acc"] + test_gain}
    metrics |= {k: 0.1 for k in metrics if k.startswith("tta/") and k.endswith("/acc")}
    metrics["tta/sumi/acc"] = 0.9
    return [*records, RunRecord(tmp_path, "wild_long", 0, metrics, records[0].curves, config={"data": {"seed": 0}})]


def test_failed_4x_check_makes_every_verdict_underfit(tmp_path: Path):
    by_id, result = _judge(_with_long(tmp_path, val_gain=0.02, test_gain=0.0), tmp_path)  # clean accuracy gains
    for id_ in ("sumi_vs_tent", "sumi_vs_eata", "sumi_vs_sar", "sumi_vs_no_unimodal", "sumi_vs_no_mi"):
        assert by_id[id_].verdict == "inconclusive: underfit", id_
        assert "the longer run (wild_long) improves val/acc by 0.02" in by_id[id_].why
    assert by_id["sumi_vs_tent"].n == (3, 3)  # the 4x run is not a fourth pair
    assert not result.convergence["wild"][0] and "wild_long" not in result.convergence
    longer = next(t for t in result.tables if t.title.startswith("4x check"))
    assert ["wild", "0", "sumi", "66.0", "90.0", "+0.0", "+0.0"] in longer.rows
    assert ["wild", "0", "tent", "60.0", "10.0", "-6.0", "-80.0"] in longer.rows
    stream = next(t for t in result.tables if t.title.startswith("Test-time"))
    assert next(r for r in stream.rows if r[0] == "sumi")[1] == "66.8 ± 0.9"  # the main table keeps three seeds
    assert ["wild_long", "97.0", "84.0", "72.0"] in result.tables[0].rows  # the source table shows the 4x model


def test_stream_gain_alone_is_shown_but_is_no_convergence_test(tmp_path: Path):
    """A 4x source model that overfits the clean pairs but gains on the corrupted stream is not an underfit one."""
    by_id, result = _judge(_with_long(tmp_path, val_gain=-0.02, test_gain=0.05), tmp_path)
    ok, why = result.convergence["wild"]
    assert ok and "4x check passed" in why
    note = next(t for t in result.tables if t.title.startswith("4x check")).note
    assert "wild: converged: the longer run (wild_long) worsens val/acc by 0.02" in note
    assert "stream accuracy before adaptation (not a convergence test): the longer run (wild_long) improves " in note
    assert by_id["sumi_vs_tent"].verdict == "reproduced"


def test_a_source_model_still_improving_makes_the_verdicts_underfit(tmp_path: Path):
    records = _records(tmp_path, unimodal_gap=0.05)
    for r in records:
        r.curves = {"val/acc": [(0, 0.5), (50, 0.7), (100, 0.9)]}
    by_id, _ = _judge(records, tmp_path)
    assert by_id["sumi_vs_tent"].verdict == "inconclusive: underfit" and "still improving" in by_id["sumi_vs_tent"].why


def test_4x_table_pairs_every_seed_with_a_4x_run(tmp_path: Path):
    records = _with_long(tmp_path, val_gain=0.001, test_gain=0.01)
    seed1 = RunRecord(tmp_path, "wild_long", 1, {"tta/sumi/acc": 0.8, "tta/tent/acc": 0.2}, {})
    by_id, result = _judge([*records, seed1], tmp_path)
    longer = next(t for t in result.tables if t.title.startswith("4x check"))
    # seeds 0 and 1: 1x tent 60.0 / 60.4, 4x 10 / 20; gaps to SuMi -6 / -6.1 at 1x, -80 / -60 at 4x
    assert ["wild", "0, 1", "tent", "60.2 ± 0.3", "15.0 ± 7.1", "-6.1 ± 0.1", "-70.0 ± 14.1"] in longer.rows
    assert by_id["sumi_vs_tent"].verdict == "reproduced"  # seed 1's 4x run has no val/acc to check
