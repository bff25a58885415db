"""TS-LIF claim report hook: robustness table, seed-aware verdicts, curves and the frequency-response plot."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from reports.ts_lif import claim_report, compare, verdicts
from suite.report import verdict_table


@dataclass
class _Rec:
    name: str
    metrics: dict[str, float] = field(default_factory=dict)
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


def _neuron(d0=0.8):
    return {"neuron/d0": d0, "neuron/d1": 0.2, "neuron/d2": 0.3, "neuron/d3": 0.7, "neuron/kappa": 0.8,
            "neuron/gamma_ds": 0.1, "neuron/spectral_radius": 0.9}  # fmt: skip


def test_verdicts_cover_the_ablations_and_the_missing_data_runs():
    flat = {"val/r2": [(0, 0.2), (100, 0.3), (500, 0.3)]}  # plateaued

    def rec(name, r2, miss50, dr2=0.0):
        return [_Rec(name, {"test/r2": r2 + d, "test/r2_miss50": miss50 + d}, flat) for d in (-0.01 - dr2, 0.01 + dr2)]

    recs = rec("ts_lif_h24", 0.30, 0.25) + rec("lif_h24", 0.20, 0.10)
    recs += rec("ts_lif_no_soma_h24", 0.25, 0.20) + rec("ts_lif_no_dspike_h24", 0.30, 0.25, dr2=0.02)
    recs += rec("ts_lif_h24_m30", 0.27, 0.25) + rec("lif_h24_m30", 0.20, 0.10) + rec("tc_lif_h24_m30", 0.27, 0.20)
    md = verdict_table(verdicts(recs, {"sizing_metric": "val/r2", "sizing_higher_is_better": True}))
    assert "| Ablation: somatic injection raises TS-LIF's R^2 (h24) | **reproduced** | test R^2: 0.3 ± 0.014" in md
    assert "| Ablation: the dendritic spike raises TS-LIF's R^2 (h24) | **inconclusive: within noise** |" in md
    assert "| Trained with 30% missing inputs, TS-LIF forecasts better than LIF (h24) | **reproduced** |" in md
    assert "| Trained with 30% missing inputs, TS-LIF forecasts better than TC-LIF (h24) | **inconclusive: within" in md
    # R^2 lost from 30% to 50% missing: TS-LIF 0.02, TC-LIF 0.07, LIF 0.10 (lower is better)
    assert "TS-LIF loses less R^2 than TC-LIF at 50% (h24) | **reproduced** | R^2 lost from 30% to 50% missing" in md
    assert "TS-LIF loses less R^2 than LIF at 50% (h24) | **reproduced** |" in md
    # the margin must beat two standard errors: noisy drops (spread 0.06 per entry) leave a 0.05 gap within noise
    noisy = [_Rec(n, {"test/r2": 0.3, "test/r2_miss50": 0.3 - d}, flat) for n, ds in
             (("ts_lif_h24_m30", (0.0, 0.06)), ("tc_lif_h24_m30", (0.05, 0.11))) for d in ds]  # fmt: skip
    md = verdict_table(verdicts(noisy, {"sizing_metric": "val/r2", "sizing_higher_is_better": True}))
    assert "TS-LIF loses less R^2 than TC-LIF at 50% (h24) | **inconclusive: within noise** |" in md


def test_compare_needs_two_standard_errors():
    assert compare((0.5, 0.0, 3), (0.4, 0.0, 3))[2] == "better"
    diff, se, verdict = compare((0.50, 0.1, 3), (0.45, 0.1, 3))
    assert diff == pytest.approx(0.05) and se == pytest.approx((2 * 0.01 / 3) ** 0.5)
    assert verdict == "no clear difference"
    assert compare((0.3, 0.01, 3), (0.5, 0.01, 3))[2] == "worse"


def test_claim_report(tmp_path):
    curve = {"val/r2": [(99, 0.2), (199, 0.3)]}  # still rising at the stop
    flat = {"val/r2": [(99, 0.2), (199, 0.3), (499, 0.3)]}
    recs = [
        _Rec("ts_lif_h6", {"test/r2": 0.50, "test/r2_miss10": 0.45, "test/r2_miss30": 0.40, **_neuron()}, curve),
        _Rec("ts_lif_h6", {"test/r2": 0.52, "test/r2_miss10": 0.47, "test/r2_miss30": 0.42, **_neuron(0.7)}, curve),
        _Rec("lif_h6", {"test/r2": 0.45, "test/r2_miss10": 0.35, "test/r2_miss30": 0.25}),
        _Rec("lif_h6", {"test/r2": 0.45, "test/r2_miss10": 0.35, "test/r2_miss30": 0.25}),
        _Rec("ts_lif_h24", {"test/r2": 0.30, "test/r2_miss10": 0.28, "test/r2_miss30": 0.25, **_neuron()}, flat),
        _Rec("lif_h24", {"test/r2": 0.20, "test/r2_miss10": 0.15, "test/r2_miss30": 0.10}, flat),
        # trained with 30% missing inputs: compared with the baseline trained the same way, not in the horizon trend
        _Rec("ts_lif_h24_m30", {"test/r2": 0.27, "test/r2_miss10": 0.27, "test/r2_miss30": 0.26, **_neuron()}),
        _Rec("lif_h24_m30", {"test/r2": 0.27, "test/r2_miss10": 0.27, "test/r2_miss30": 0.26}),
    ]
    # without a spec the hook reads conf/claim/ts_lif.yaml, whose runs early-stop (sizing_patience 12): three
    # validations cannot show 12 without a new best, so even the flat h24 curves are underfit there
    h24 = "| TS-LIF forecasts better than LIF (R^2, horizon 24) | "
    assert h24 + "**inconclusive: underfit** |" in claim_report(recs, tmp_path)
    md = claim_report(recs, tmp_path, {"sizing_metric": "val/r2", "sizing_higher_is_better": True})  # endpoint rule
    assert "| run | R^2 | R^2 @10% | R^2 @30% | drop 0 -> 30% | spectral radius |" in md
    assert "| ts_lif_h6 | 0.5100 ± 0.014 | 0.4600 ± 0.014 | 0.4100 ± 0.014 | 0.1000 ± 0.000 | 0.900 |" in md
    assert "ts_lif_h6 vs lif_h6: ΔR^2 = +0.0600 ± 0.0100 (TS-LIF better)" in md
    assert "R^2 drop at 30% missing: TS-LIF +0.1000, lif_h6 +0.2000 (TS-LIF robustness better)" in md
    assert "ΔR^2 vs lif by horizon (h6: +0.0600, h24: +0.1000): grows with horizon" in md
    assert "ts_lif_h24_m30 vs lif_h24_m30: ΔR^2 = +0.0000" in md
    assert "| TS-LIF forecasts better than LIF (R^2, horizon 6) | **inconclusive: underfit** |" in md
    assert h24 + "**reproduced** | test R^2 0.3 (1 seed) vs 0.2" in md
    assert "| TS-LIF's R^2 gain over LIF grows with the horizon | **inconclusive: underfit** |" in md
    assert "| TS-LIF degrades less than LIF with missing inputs (h24) | **reproduced** |" in md
    # the missing-data runs get verdicts of their own: R^2 at the training ratio, and the loss from 30% to 50%
    m30 = "| Trained with 30% missing inputs, TS-LIF forecasts better than LIF (h24) | **inconclusive: underfit** |"
    assert m30 in md  # neither m30 run logged a validation curve
    assert "| init (TS-LIF) | 0.800 | 0.200 | 0.300 | 0.700 | 0.800 | 0.100 | 0.919 | 1.167, " in md
    assert (tmp_path / "ts_lif_freq.png").stat().st_size > 1000
    assert (tmp_path / "ts_lif_val_r2.png").stat().st_size > 1000


@dataclass
class _SeedRec(_Rec):
    seed: int = 0


def test_a_passed_4x_check_settles_a_noisy_curve_and_a_failed_one_makes_it_underfit(tmp_path):
    # +0.02 over the last 20%; the seeds share this curve, so the rule's yardstick is 1% of 0.52 (0.0052)
    rising = {"val/r2": [(0, 0.40), (3200, 0.50), (4000, 0.52)]}
    flat = {"val/r2": [(0, 0.20), (3200, 0.30), (4000, 0.30)]}

    def entry(name, r2s, curve):
        return [_SeedRec(name, {"test/r2": v, "test/r2_miss50": v - 0.1}, curve, seed=s) for s, v in enumerate(r2s)]

    recs = entry("ts_lif_h6", (0.55, 0.56, 0.57), flat) + entry("lif_h6", (0.480, 0.481, 0.482), rising)
    recs += entry("ts_lif_h24", (0.30, 0.31, 0.32), flat) + entry("tc_lif_h24", (0.270, 0.271, 0.272), rising)
    spec = {"sizing_metric": "val/r2", "sizing_higher_is_better": True}
    before = verdict_table(verdicts(recs, spec))
    assert "better than LIF (R^2, horizon 6) | **inconclusive: underfit** | " in before  # endpoint rule alone
    # 4x runs (seed 0): LIF h6 gains 0.0005 (< its test spread 0.001), TC-LIF h24 gains 0.02 (> 0.001)
    recs += entry("lif_h6_long", (0.4805,), flat) + entry("tc_lif_h24_long", (0.29,), flat)
    md = claim_report(recs, tmp_path, spec)
    assert "better than LIF (R^2, horizon 6) | **reproduced** | " in md
    assert "all converged (lif_h6 by its 4x check, the others plateaued)" in md
    assert "better than TC-LIF (R^2, horizon 24) | **inconclusive: underfit** | " in md
    assert "not converged: tc_lif_h24" in md
    assert "- **lif_h6**: converged: the longer run (lif_h6_long) improves test/r2 by 0.0005 on seed 0" in md
    assert "- **tc_lif_h24**: not converged: the longer run (tc_lif_h24_long) improves test/r2 by 0.02" in md
    assert "| lif_h6_long |" not in md and "lif_h6_long vs" not in md  # the 4x runs stay out of the tables
    # a failed check overrides a plateaued curve too: TS-LIF h24 flat, but its 4x run gains 0.05 (> spread 0.01)
    md = claim_report([*recs, *entry("ts_lif_h24_long", (0.35,), flat)], tmp_path, spec)
    assert "better than LIF (R^2, horizon 6) | **reproduced** | " in md  # h6 untouched
    assert "- **ts_lif_h24**: not converged: the longer run (ts_lif_h24_long) improves test/r2 by 0.05" in md
    assert "not converged: ts_lif_h24, tc_lif_h24" in md


def test_runs_ended_by_early_stopping_are_judged_by_the_stopping_rule(tmp_path):
    # sizing_patience 2: "stopped" has its best 2 validations before the end; "capped" sets a new best at the end
    stopped = {"val/r2": [(400, 0.40), (800, 0.45), (1200, 0.43), (1600, 0.44)]}
    capped = {"val/r2": [(400, 0.40), (800, 0.45), (1200, 0.44), (1600, 0.46)]}

    def entry(name, r2s, curve):
        return [_SeedRec(name, {"test/r2": v, "test/r2_miss50": v - 0.1}, curve, seed=s) for s, v in enumerate(r2s)]

    recs = entry("ts_lif_h24", (0.33, 0.34, 0.35), stopped) + entry("lif_h24", (0.25, 0.26, 0.27), stopped)
    recs += entry("tc_lif_h24", (0.29, 0.30, 0.31), capped)
    spec = {"sizing_metric": "val/r2", "sizing_higher_is_better": True, "sizing_patience": 2}
    md = verdict_table(verdicts(recs, spec))
    assert "better than LIF (R^2, horizon 24) | **reproduced** | test R^2 0.34 ± 0.01 (n=3) vs 0.26" in md
    assert "all plateaued" in md
    assert "better than TC-LIF (R^2, horizon 24) | **inconclusive: underfit** |" in md and "not converged: tc_lif" in md
    # the endpoint rule (no sizing_patience) reads the stopped curve's +0.01 over its last 20% as rising
    md = verdict_table(verdicts(recs, {k: v for k, v in spec.items() if k != "sizing_patience"}))
    assert "better than LIF (R^2, horizon 24) | **inconclusive: underfit** |" in md


def test_each_verdict_names_the_entry_it_is_read_against_so_a_weak_baseline_flips_it():
    from suite.report import WEAK

    flat = {"val/r2": [(0, 0.2), (100, 0.3), (500, 0.3)]}
    recs = [_Rec(n, {"test/r2": r2 + d}, flat) for n, r2 in (("ts_lif_h24", 0.3), ("lif_h24", 0.1))
            for d in (-0.01, 0.01)]  # fmt: skip
    spec = {"sizing_metric": "val/r2", "sizing_higher_is_better": True}
    (v,) = verdicts(recs, spec)
    assert v.verdict == "reproduced" and v.against == ("lif_h24",)
    md = verdict_table([v], weak={"lif_h24": "ends no better than its start"})
    assert f"| TS-LIF forecasts better than LIF (R^2, horizon 24) | **{WEAK}** |" in md
