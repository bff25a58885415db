"""TS-LIF claim report hook: robustness table, verdicts and the frequency-response plot from fake run records."""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_modules.ts_lif.report import claim_report


@dataclass
class _Rec:
    name: str
    metrics: dict[str, float] = field(default_factory=dict)


def _neuron(d0=0.8):
    return {"neuron/d0": d0, "neuron/d1": 0.2, "neuron/d2": 0.3, "neuron/d3": 0.7, "neuron/kappa": 0.8,
            "neuron/gamma_ds": 0.1, "neuron/spectral_radius": 0.9}  # fmt: skip


def test_claim_report(tmp_path):
    recs = [
        _Rec("ts_lif_h6", {"test/r2": 0.50, "test/r2_miss10": 0.45, "test/r2_miss30": 0.40, **_neuron()}),
        _Rec("ts_lif_h6", {"test/r2": 0.52, "test/r2_miss10": 0.47, "test/r2_miss30": 0.42, **_neuron(0.7)}),
        _Rec("lif_h6", {"test/r2": 0.45, "test/r2_miss10": 0.35, "test/r2_miss30": 0.25}),
        _Rec("ts_lif_h24", {"test/r2": 0.30, "test/r2_miss10": 0.28, "test/r2_miss30": 0.25, **_neuron()}),
        _Rec("lif_h24", {"test/r2": 0.20, "test/r2_miss10": 0.15, "test/r2_miss30": 0.10}),
    ]
    md = claim_report(recs, tmp_path)
    assert "| ts_lif_h6 | 0.5100 ± 0.014 | 0.4600 ± 0.014 | 0.4100 ± 0.014 | 0.1000 ± 0.000 | 0.900 |" in md
    assert "ts_lif_h6 vs lif_h6: ΔR^2 = +0.0600 (TS-LIF better)" in md
    assert "ΔR^2 vs lif by horizon (h6: +0.0600, h24: +0.1000): rises with horizon; positive" in md
    assert (tmp_path / "ts_lif_freq.png").stat().st_size > 1000
