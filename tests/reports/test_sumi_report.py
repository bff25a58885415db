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
