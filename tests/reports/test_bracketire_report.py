"""reports/bracketire.py: verdicts from the numbers (reproduced, underfit, phenomenon absent) and the page table."""

from __future__ import annotations

from pathlib import Path

from reports.bracketire import claim_report
from suite.compare import RunRecord


def _records(tmp_path: Path, alpha: float, flat: bool = True) -> list[RunRecord]:
    out = []
    for name, psnr in (("tmrnet", 20.0), ("shared", 18.0), ("single", 15.0), ("average", 14.0)):
        for seed in range(3):
            last = psnr + 0.1 * seed
            curve = [(i * 10, last - (0.0 if flat else 4.0 - i)) for i in range(5)]
            metrics = {"test/psnr": last, "test/ssim": 0.5, "test/alpha_abs": alpha if name == "tmrnet" else 0.0}
            curves = {} if name == "average" else {"val/psnr": curve}
            out.append(RunRecord(tmp_path, name, seed, metrics, curves))
    return out


def test_verdicts_follow_the_numbers(tmp_path: Path):
    page = claim_report(_records(tmp_path, alpha=0.3), tmp_path)
    assert "| TMRNet beats the single-frame network (BracketIRE) | **reproduced** |" in page
    assert "| TMRNet beats the shared-only recurrence (frame-specific blocks help) | **reproduced** |" in page
    assert "frame averaging | **reproduced** |" in page  # average has no curve (train=false): not an underfit
    off = claim_report(_records(tmp_path, alpha=0.001), tmp_path)
    assert "(frame-specific blocks help) | **inconclusive: phenomenon absent** |" in off
    longer = [*_records(tmp_path, alpha=0.3), RunRecord(tmp_path, "tmrnet_long", 0, {"test/psnr": 23.0})]
    assert "| TMRNet beats the single-frame network (BracketIRE) | **inconclusive: underfit** |" in claim_report(
        longer, tmp_path
    )
    rising = claim_report(_records(tmp_path, alpha=0.3, flat=False), tmp_path)
    assert "| TMRNet beats the single-frame network (BracketIRE) | **inconclusive: underfit** |" in rising
    assert "| tmrnet | TMRNet (alpha learnable, init 0) | 20.1 ± 0.1 (n=3) |" in page
