"""reports/sumi.py: paired verdicts, the per-modality source table, and unimodal assistance judged `phenomenon
absent` when its mask removes (almost) no sample from SuMi's selected set."""

from __future__ import annotations

from pathlib import Path

from reports.sumi import claim_report
from suite.compare import RunRecord


def _records(tmp_path: Path, unimodal_gap: float) -> list[RunRecord]:
    out = []
    for seed in range(3):
        j = 0.004 * seed
        metrics = {"val/acc": 0.95 + j, "val/acc_audio": 0.84 + j, "val/acc_video": 0.72 + j}
        for name, acc, sel in [("tent", 0.60, 1.0), ("eata", 0.61, 0.45), ("sar", 0.60, 0.7),
                               ("sumi", 0.66, 0.40), ("sumi_no_unimodal", 0.62, 0.40 + unimodal_gap),
                               ("sumi_no_mi", 0.63, 0.40), ("sumi_no_iqr", 0.64, 0.55)]:  # fmt: skip
            metrics |= {f"tta/{name}/acc": acc + j, f"tta/{name}/selected": sel,
                        f"tta/{name}/acc_q1": acc, f"tta/{name}/acc_q4": acc}  # fmt: skip
        curve = {"val/acc": [(i, min(0.95 + j, 0.5 + 0.1 * i)) for i in range(16)]}  # plateaued
        out.append(RunRecord(tmp_path, "wild", seed, metrics, curve))
    return out


def _verdict(page: str, claim: str) -> str:
    return next(line for line in page.splitlines() if claim in line).split("|")[2].strip()


def test_unimodal_assistance_needs_its_mask_to_bind(tmp_path: Path):
    page = claim_report(_records(tmp_path, unimodal_gap=0.05), tmp_path)
    assert _verdict(page, "SuMi adapts more accurately than Tent") == "**reproduced**"
    assert _verdict(page, "Unimodal assistance raises") == "**reproduced**"
    assert "the unimodal mask removed 5.0% of the stream" in page
    assert "| wild | 0.954 ± 0.004 (n=3) | 0.844 ± 0.004 (n=3) | 0.724 ± 0.004 (n=3) |" in page  # per modality
    page = claim_report(_records(tmp_path, unimodal_gap=0.002), tmp_path)  # same samples: nothing was tested
    assert _verdict(page, "Unimodal assistance raises") == "**inconclusive: phenomenon absent**"
    assert _verdict(page, "Mutual-information sharing raises") == "**reproduced**"


def _with_long(tmp_path: Path, val_gain: float, test_gain: float) -> list[RunRecord]:
    """The three seeds plus seed 0's 4x run, whose source model gains ``val_gain`` / ``test_gain`` over seed 0 and
    whose adapted variants score far from the main runs (so that leaking it into the pairs would show)."""
    records = _records(tmp_path, unimodal_gap=0.05)
    for r in records:
        r.metrics["test/acc"] = 0.55 + 0.02 * r.seed  # seed spread 0.02
    metrics = dict(records[0].metrics)
    metrics |= {"val/acc": metrics["val/acc"] + val_gain, "test/acc": metrics["test/acc"] + test_gain}
    metrics |= {k: 0.1 for k in metrics if k.startswith("tta/") and k.endswith("/acc")}
    metrics["tta/sumi/acc"] = 0.9
    return [*records, RunRecord(tmp_path, "wild_long", 0, metrics, records[0].curves)]


def test_failed_4x_check_makes_every_verdict_underfit(tmp_path: Path):
    page = claim_report(_with_long(tmp_path, val_gain=0.02, test_gain=0.0), tmp_path)  # clean accuracy still gains
    for claim in ("than Tent", "than EATA", "than SAR", "Unimodal assistance", "Mutual-information", "IQR"):
        assert _verdict(page, claim) == "**inconclusive: underfit**", claim
    assert "- **wild**: not converged: the longer run (wild_long) improves val/acc by 0.02" in page
    assert "source model wild: plateaued, 4x check failed" in page.split("## Verdicts")[1]
    assert "| wild | 0 | sumi | 66.0 | 90.0 | +0.0 | +0.0 |" in page
    assert "| wild | 0 | tent | 60.0 | 10.0 | -6.0 | -80.0 |" in page
    # the 4x run is not a fourth pair, and the main table keeps its three seeds
    assert "| sumi | 66.4 ± 0.4 |" in page
    assert "(n=4)" not in page.split("## 4x check")[1]
    assert "| wild_long | 0.97 (1 seed) |" in page  # the source table shows the 4x model


def test_stream_gain_alone_is_shown_but_is_no_convergence_test(tmp_path: Path):
    """A 4x source model that overfits the clean pairs but gains on the corrupted stream is not an underfit one."""
    page = claim_report(_with_long(tmp_path, val_gain=-0.02, test_gain=0.05), tmp_path)
    assert "- **wild**: converged: the longer run (wild_long) worsens val/acc by 0.02" in page
    assert (
        "- wild, stream accuracy before adaptation (not a test): the longer run (wild_long) improves test/acc by 0.05"
        in page
    )
    assert _verdict(page, "SuMi adapts more accurately than Tent") == "**reproduced**"
    assert "source model wild: plateaued, 4x check passed" in page.split("## Verdicts")[1]


def test_4x_table_pairs_every_seed_with_a_4x_run(tmp_path: Path):
    records = _with_long(tmp_path, val_gain=0.001, test_gain=0.01)
    seed1 = RunRecord(tmp_path, "wild_long", 1, {"tta/sumi/acc": 0.8, "tta/tent/acc": 0.2}, {})
    page = claim_report([*records, seed1], tmp_path)
    # seeds 0 and 1: 1x tent 60.0 / 60.4, 4x 10 / 20; gaps to SuMi -6 / -6 at 1x, -80 / -60 at 4x
    assert "| wild | 0, 1 | tent | 60.2 ± 0.3 | 15.0 ± 7.1 | -6.0 ± 0.0 | -70.0 ± 14.1 |" in page
    assert _verdict(page, "SuMi adapts more accurately than Tent") == "**reproduced**"  # seed 1 has no val/acc to check
