"""Claim-report hooks of systematic_outliers (reports.systematic_outliers) and ostquant (reports.ostquant) on
hand-written run folders: the tables carry the numbers of the files and the computed verdicts follow the criteria."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from reports import ostquant as quant_report
from reports import ostquant_minilm
from reports import systematic_outliers as outlier_report
from suite.compare import RunRecord


def _census(folder: Path, ratio: float, sink0: float, step: int = 100) -> None:
    folder.mkdir(parents=True)
    rows = []
    for layer, (r, s) in enumerate([(ratio, sink0), (ratio / 2, 0.05)]):
        rows += [
            {"step": step, "kind": "act", "name": f"net.blocks.{layer}", "metric": "ratio", "value": r},
            {"step": step, "kind": "act", "name": f"net.blocks.{layer}", "metric": "token_frac_k100", "value": 0.0},
            {"step": step, "kind": "attn", "name": f"net.blocks.{layer}.mixer", "metric": "sink_share", "value": s},
            {
                "step": step,
                "kind": "weight",
                "name": f"net.blocks.{layer}.mlp.down_proj",
                "metric": "ratio",
                "value": 9,
            },
        ]
    rows.append({"step": 0, "kind": "act", "name": "net.blocks.0", "metric": "ratio", "value": 1.0})  # earlier step
    with (folder / "outlier_census.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["step", "kind", "name", "metric", "value"])
        w.writeheader()
        w.writerows(rows)


def test_outlier_report_table_and_verdict(tmp_path, monkeypatch):
    recs = []
    for name, ratio, sink in (("softmax", 400.0, 0.6), ("ca_scale", 20.0, 0.06)):
        _census(tmp_path / name / "csv", ratio, sink)
        recs.append(
            RunRecord(
                tmp_path / name, name, 0, {"test/loss": 2.0}, {"val/loss": [(50, 2.5)]}, {"data": {"seq_len": 64}}
            )
        )
    per = outlier_report._runs(recs)
    table, numbers = outlier_report.variant_table(per, 64)
    assert "| softmax | 1 | 400.0 / 200.0 | 400.0 |" in table[2] and "0.60 / 0.05" in table[2]
    assert numbers["ca_scale"]["ratio_max"] == 20.0 and numbers["softmax"]["sink_max"] == 0.6
    lines = outlier_report.verdict(numbers, 64)
    assert "massive activations" in lines[0] and "an attention sink" in lines[0]
    assert "massive activations removed" in lines[1] and "sink removed" in lines[1]
    assert outlier_report.uniform_sink_share(3) == pytest.approx((1 / 2 + 1 / 3) / 2)
    monkeypatch.setattr(outlier_report, "minilm_census", lambda: ["| minilm |"])
    page = outlier_report.claim_report(recs, tmp_path)
    assert "| minilm |" in page and (tmp_path / "systematic_outliers_census.png").exists()


def test_outlier_report_averages_seeds_and_judges_each(tmp_path):
    """Two seeds: the val-loss column is the mean over seeds at each evaluation, and the verdict says in how many
    seeds the variant removes the sink (here only one), with the paired test-loss change."""
    recs = []
    for seed, sinks, losses in ((0, (0.6, 0.06), (2.0, 1.8)), (1, (0.6, 0.5), (2.2, 2.3))):
        for name, sink, loss in zip(("softmax", "ca_scale"), sinks, losses):
            folder = tmp_path / f"{name}{seed}"
            _census(folder / "csv", 50.0, sink)
            val = {"val/loss": [(50, 2.5 + seed), (100, 2.0 + seed)]}
            recs.append(RunRecord(folder, name, seed, {"test/loss": loss}, val, {"data": {"seq_len": 64}}))
    table, numbers = outlier_report.variant_table(outlier_report._runs(recs), 64)
    assert "| softmax | 2 |" in table[2] and "| 3.000 2.500 |" in table[2]  # mean of (2.5, 3.5) and (2.0, 3.0)
    lines = outlier_report.verdict(numbers, 64)
    assert "sink share / baseline's by seed 0.10, 0.83 (removed in 1 of 2)" in lines[1]
    assert "paired test-loss change -0.0500 ± 0.2121 (lower in 1 of 2 seeds)" in lines[1]


def test_quant_report_tables_and_ranking(tmp_path):
    recs = []
    for subject, gaps in (("softmax", {"rtn": 4.0, "quarot": 1.0, "ostquant": 0.5}), ("gdn", {"rtn": 1.0})):
        folder = tmp_path / subject
        folder.mkdir()
        results = {"fp": {"ppl": 10.0, "kl": 0.0, "ppl_gap": 0.0}}
        results |= {m: {"ppl": 10.0 + g, "kl": g / 100, "ppl_gap": g, "log_qsur": -50.0} for m, g in gaps.items()}
        (folder / "quant_calibration.json").write_text(json.dumps({"bits": {"w_bits": 4}, "results": results}))
        recs.append(RunRecord(folder, subject, 0))
    page = quant_report.claim_report(recs, tmp_path)
    assert "| softmax | 10.000 | 14.000 (+4.000 ± 0.000) | 11.000 (+1.000 ± 0.000) | 10.500 (+0.500 ± 0.000) |" in page
    assert "| gdn | 10.000 | 11.000 (+1.000 ± 0.000) | - | - |" in page
    assert "OSTQuant has the smallest gap on 1 of 2 subjects (softmax)" in page
    assert "RTN damage (relative perplexity increase), smallest first: gdn (+10.00 %) < softmax (+40.00 %)" in page


def test_minilm_report_table_and_verdict(tmp_path):
    recs = []
    losses = {"fp": 3.0, "rtn": 4.0, "smoothquant": 3.6, "quarot": 3.3, "ostquant": 3.2, "ostquant_kl": 3.25}
    for seed in (0, 1):
        folder = tmp_path / f"s{seed}"
        folder.mkdir()
        res = {
            m: {"loss": v + 0.01 * seed, "ppl": 2.0 * v, "kl": v - 3.0, "ppl_gap": 2.0 * (v - 3.0)}
            for m, v in losses.items()
        }
        (folder / "quant_calibration.json").write_text(json.dumps({"bits": {"w_bits": 4}, "results": res}))
        recs.append(RunRecord(folder, "minilm", seed))
    page = ostquant_minilm.claim_report(recs, tmp_path)
    assert "| RTN | 4.0050 ± 0.0071 | +1.0000 ± 0.0000 |" in page
    assert "over 2 seeds" in page and "w_bits=4" in page
    assert "OSTQuant (+0.2000) < OSTQuant (full KL) (+0.2500) < QuaRot (+0.3000)" in page
    assert "OSTQuant has the smallest gap" in page
    assert "OSTQuant vs QuaRot: lower loss on 2 of 2 seeds." in page
    assert "KL-Top (k = 1000 of 30,522) gap +0.2000 vs full KL +0.2500" in page
