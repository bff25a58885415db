"""TS-LIF claim report hook: robustness table, seed-aware verdicts, curves and the frequency-response plot."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from reports.ts_lif import claim_report, compare


@dataclass
class _Rec:
    name: str
    metrics: dict[str, float] = field(default_factory=dict)
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


def _neuron(d0=0.8):
    return {"neuron/d0": d0, "neuron/d1": 0.2, "neuron/d2": 0.3, "neuron/d3": 0.7, "neuron/kappa": 0.8,
            "neuron/gamma_ds": 0.1, "neuron/spectral_radius": 0.9}  # fmt: skip


def test_compare_needs_two_standard_errors():
    assert compare((0.5, 0.0, 3), (0.4, 0.0, 3))[2] == "better"
    diff, se, verdict = compare((0.50, 0.1, 3), (0.45, 0.1, 3))
    assert diff == pytest.approx(0.05) and se == pytest.approx((2 * 0.01 / 3) ** 0.5)
    assert verdict == "no clear difference"
    assert compare((0.3, 0.01, 3), (0.5, 0.01, 3))[2] == "worse"


def test_claim_report(tmp_path):
    curve = {"val/r2": [(99, 0.2), (199, 0.3)]}
    recs = [
        _Rec("ts_lif_h6", {"test/r2": 0.50, "test/r2_miss10": 0.45, "test/r2_miss30": 0.40, **_neuron()}, curve),
        _Rec("ts_lif_h6", {"test/r2": 0.52, "test/r2_miss10": 0.47, "test/r2_miss30": 0.42, **_neuron(0.7)}, curve),
        _Rec("lif_h6", {"test/r2": 0.45, "test/r2_miss10": 0.35, "test/r2_miss30": 0.25}),
        _Rec("lif_h6", {"test/r2": 0.45, "test/r2_miss10": 0.35, "test/r2_miss30": 0.25}),
        _Rec("ts_lif_h24", {"test/r2": 0.30, "test/r2_miss10": 0.28, "test/r2_miss30": 0.25, **_neuron()}),
        _Rec("lif_h24", {"test/r2": 0.20, "test/r2_miss10": 0.15, "test/r2_miss30": 0.10}),
        # trained with 30% missing inputs: compared with the baseline trained the same way, not in the horizon trend
        _Rec("ts_lif_h24_m30", {"test/r2": 0.27, "test/r2_miss10": 0.27, "test/r2_miss30": 0.26, **_neuron()}),
        _Rec("lif_h24_m30", {"test/r2": 0.27, "test/r2_miss10": 0.27, "test/r2_miss30": 0.26}),
    ]
    md = claim_report(recs, tmp_path)
    assert "| run | R^2 | R^2 @10% | R^2 @30% | drop 0 -> 30% | spectral radius |" in md
    assert "| ts_lif_h6 | 0.5100 ± 0.014 | 0.4600 ± 0.014 | 0.4100 ± 0.014 | 0.1000 ± 0.000 | 0.900 |" in md
    assert "ts_lif_h6 vs lif_h6: ΔR^2 = +0.0600 ± 0.0100 (TS-LIF better)" in md
    assert "R^2 drop at 30% missing: TS-LIF +0.1000, lif_h6 +0.2000 (TS-LIF robustness better)" in md
    assert "ΔR^2 vs lif by horizon (h6: +0.0600, h24: +0.1000): grows with horizon" in md
    assert "ts_lif_h24_m30 vs lif_h24_m30: ΔR^2 = +0.0000" in md
    assert "| init (TS-LIF) | 0.800 | 0.200 | 0.300 | 0.700 | 0.800 | 0.100 | 0.919 | 1.167, " in md
    assert (tmp_path / "ts_lif_freq.png").stat().st_size > 1000
    assert (tmp_path / "ts_lif_val_r2.png").stat().st_size > 1000
