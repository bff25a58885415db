"""reports/bracketire.py with the declared claims of conf/claim/bracketire.yaml: verdict objects (reproduced, underfit
by the 4x checks or the adaptation's own curve, phenomenon absent), the tables and the example figures."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from reports.bracketire import ADAPT_FLAT, ADAPTED, SWEEP, adaptation_converged, claim_report
from suite import stats
from suite.claim import judge_page, load_spec
from suite.claims import ClaimSpec
from suite.compare import RunRecord

# per-seed jitter of the test PSNR, so that the paired intervals have a spread
JITTER = {"tmrnet": (0.0, 0.04, -0.03), "shared": (0.02, -0.05, 0.0), "single": (-0.03, 0.0, 0.05)}


@pytest.fixture
def spec() -> ClaimSpec:
    return ClaimSpec.from_dict("bracketire", load_spec("bracketire"))


def _run(tmp_path: Path, name: str, seed: int, metrics: dict, curves: dict | None = None, config: dict | None = None):
    config = {"data": {"seed": seed}, **(config or {})}  # data.seed = the run seed: the default pairing
    return RunRecord(tmp_path / name / str(seed), name, seed, metrics, curves or {}, config)


def _records(tmp_path: Path, alpha: float, flat: bool = True) -> list[RunRecord]:
    out = []
    for name, psnr in (("tmrnet", 20.0), ("shared", 18.0), ("single", 15.0), ("average", 14.0)):
        for seed in range(3):
            last = psnr + 0.1 * seed + JITTER.get(name, (0.0,) * 3)[seed]
            curve = [(i * 10, last - (0.0 if flat else 4.0 - i)) for i in range(5)]
            metrics = {"test/psnr": last, "test/ssim": 0.5, "test/alpha_abs": alpha if name == "tmrnet" else 0.0}
            out.append(_run(tmp_path, name, seed, metrics, None if name == "average" else {"val/psnr": curve}))
    return out


def _judge(spec: ClaimSpec, records: list[RunRecord], tmp_path: Path) -> dict:
    verdicts, *_ = judge_page(spec, records, tmp_path)
    return {v.id: v for v in verdicts}


def test_the_spec_declares_the_headline_and_scores_the_final_weights(spec: ClaimSpec):
    assert {c.id for c in spec.claims if c.primary} == {
        "tmrnet_vs_single",
        "tmrnet_vs_early",
        "plus_tmrnet_vs_single",
        "adapt_vs_none",
    }
    assert all(c.higher_is_better and c.metric == "test/psnr" and c.delta == 0.2 for c in spec.claims)
    assert spec.claim("adapt_vs_none").paired and spec.claim("self_term").paired
    assert spec.evaluate == "last" and set(spec.untrained) == {"average", "adapt_none"}


def test_verdicts_follow_the_numbers(spec: ClaimSpec, tmp_path: Path):
    v = _judge(spec, _records(tmp_path, alpha=0.3), tmp_path)
    assert v["tmrnet_vs_single"].verdict == stats.REPRODUCED and v["tmrnet_vs_single"].paired
    assert v["tmrnet_vs_single"].lo > 4.8 and v["tmrnet_vs_single"].hi < 5.2  # +5 dB, paired by seed
    assert v["tmrnet_vs_shared"].verdict == stats.REPRODUCED
    assert v["tmrnet_vs_average"].verdict == stats.REPRODUCED  # average trains nothing: not an underfit
    assert v["tmrnet_vs_early"].verdict == stats.NOISE and v["tmrnet_vs_early"].diff is None  # no early runs
    # mean |alpha| below MIN_ALPHA on converged runs: the frame-specific branches never switched on
    off = _judge(spec, _records(tmp_path, alpha=0.001), tmp_path)
    assert off["tmrnet_vs_shared"].verdict == stats.ABSENT and "stayed off" in off["tmrnet_vs_shared"].why
    assert off["tmrnet_vs_single"].verdict == stats.REPRODUCED
    # a failed 4x check: underfit, which wins over an absent alpha (more training may switch it on)
    longer = [*_records(tmp_path, alpha=0.001), _run(tmp_path, "tmrnet_long", 0, {"test/psnr": 23.0})]
    v = _judge(spec, longer, tmp_path)
    assert v["tmrnet_vs_single"].verdict == stats.UNDERFIT and "tmrnet_long" in v["tmrnet_vs_single"].why
    assert v["tmrnet_vs_shared"].verdict == stats.UNDERFIT
    rising = _judge(spec, _records(tmp_path, alpha=0.3, flat=False), tmp_path)
    assert rising["tmrnet_vs_single"].verdict == stats.UNDERFIT


def test_the_results_table(spec: ClaimSpec, tmp_path: Path):
    table = claim_report(_records(tmp_path, alpha=0.3), spec, tmp_path).tables[0]
    rows = {r[0]: r for r in table.rows}
    assert list(rows) == ["tmrnet", "shared", "single", "average"]
    assert rows["tmrnet"][2] == "20.1 ± 0.091 (n=3)" and rows["tmrnet"][4] == "0.3 ± 0 (n=3)"


def test_the_4x_check_pairs_seed_0_and_its_flag_reaches_the_other_entries(spec: ClaimSpec, tmp_path: Path):
    recs = _records(tmp_path, alpha=0.3)
    # the jitter on tmrnet_plus alone: the paired differences with single_plus spread across seeds
    for n, p, j in (("tmrnet_plus", 19.0, 0.03), ("single_plus", 16.0, 0.0)):
        flat = {"val/psnr": [(10 * i, p) for i in range(5)]}
        recs += [_run(tmp_path, n, s, {"test/psnr": p + 0.1 * s + j * (s == 1)}, flat) for s in range(3)]
    # seed 0 of tmrnet scored 20.0: a 4x run at 20.1 is within LONG_GAIN, one at 21.0 is not
    same = _judge(spec, [*recs, _run(tmp_path, "tmrnet_long", 0, {"test/psnr": 20.1})], tmp_path)
    assert same["plus_tmrnet_vs_single"].verdict == stats.REPRODUCED
    assert same["tmrnet_vs_single"].verdict == stats.REPRODUCED
    more = _judge(spec, [*recs, _run(tmp_path, "tmrnet_long", 0, {"test/psnr": 21.0})], tmp_path)
    assert more["tmrnet_vs_single"].verdict == stats.UNDERFIT and "on seed 0" in more["tmrnet_vs_single"].why
    # BracketIRE+ has no 4x check of its own: it inherits TMRNet's (same schedule)
    assert more["plus_tmrnet_vs_single"].verdict == stats.UNDERFIT
    assert "tmrnet's 4x check" in more["plus_tmrnet_vs_single"].why


# --- the adaptation: gated on its own curve, paired by seed, its lr sweep on the page -------------------------------

BEFORE = (20.0, 20.5, 21.0)  # adapt_none's test PSNR per seed: the checkpoints differ by 0.5 dB


def _adapt(
    tmp_path: Path, name: str, gain: float, moving: bool = False, lr: float | None = None, wobble: float = 0.0
) -> list[RunRecord]:
    """Seeds 0-2 of an adaptation entry that ends ``gain`` dB above its start (plus 0.01 * seed + wobble * seed**2):
    a saturated curve (flat over the last 20% of its 400 steps) or, with ``moving``, a straight line still moving at
    the end."""
    out = []
    for seed, before in enumerate(BEFORE):
        g = gain + 0.01 * seed + wobble * seed * seed
        shape = (lambda t: t / 400) if moving else (lambda t: 1.0 - math.exp(-t / 40))
        curve = [(t, 25.0 + before - 20.0 + g * shape(t)) for t in range(40, 401, 40)]
        metrics = {"test/psnr": before + g, "val/psnr@start": 25.0 + before - 20.0}
        config = {"model": {"optimizer": {"lr": lr}}} if lr is not None else {}
        out.append(_run(tmp_path, name, seed, metrics, {"val/psnr": curve}, config))
    return out


def _with_adaptation(tmp_path: Path, full: list[RunRecord], noself_gain: float = 0.1, tmrnet_long: float = 20.1):
    none = [_run(tmp_path, "adapt_none", s, {"test/psnr": b}) for s, b in enumerate(BEFORE)]
    long = [_run(tmp_path, "tmrnet_long", 0, {"test/psnr": tmrnet_long})]  # tmrnet seed 0 scored 20.0
    # adapt_noself wobbles with the seed: its paired differences with adapt_full spread
    noself = _adapt(tmp_path, "adapt_noself", noself_gain, wobble=-0.005)
    return [*_records(tmp_path, alpha=0.3), *none, *full, *noself, *long]


def test_a_converged_adaptation_that_raises_psnr_reads_reproduced_whatever_tmrnets_4x_check(
    spec: ClaimSpec, tmp_path: Path
):
    full = _adapt(tmp_path, "adapt_full", 0.3)
    for tmrnet_long in (20.1, 23.0):  # TMRNet's 4x check passes (+0.1 dB), then fails (+3 dB): no matter here
        recs = _with_adaptation(tmp_path, full, tmrnet_long=tmrnet_long)
        verdicts, _, result, _, conv, _ = judge_page(spec, recs, tmp_path)
        v = {r.id: r for r in verdicts}
        assert v["adapt_vs_none"].verdict == stats.REPRODUCED
        assert v["self_term"].verdict == stats.REPRODUCED  # +0.3 vs about +0.1 on every seed
        assert v["self_term"].paired and v["self_term"].lo > 0
        # paired by seed: +0.31, interval about +-0.025; unpaired, the checkpoints' 0.5 dB spread reads within noise
        assert v["adapt_vs_none"].paired and math.isclose(v["adapt_vs_none"].diff, 0.31)
        assert v["adapt_vs_none"].lo > 0.28 and v["adapt_vs_none"].hi < 0.34
        assert conv["adapt_full"][0] and conv["adapt_full"][1].startswith("converged (its own curve)")
    assert v["tmrnet_vs_single"].verdict == stats.UNDERFIT
    assert any("not converged by TMRNet's own gate" in n for n in result.notes)
    welch = stats.interval(
        v["adapt_vs_none"].values["adapt_full"], v["adapt_vs_none"].values["adapt_none"], paired=False
    )
    assert welch.lo < 0 < welch.hi


def test_an_adaptation_whose_curve_still_moves_reads_underfit_even_when_tmrnets_4x_check_passed(
    spec: ClaimSpec, tmp_path: Path
):
    for gain in (0.5, -0.5):  # still rising, or still falling: either way the adaptation has not settled
        recs = _with_adaptation(tmp_path, _adapt(tmp_path, "adapt_full", gain, moving=True))
        v = _judge(spec, recs, tmp_path)
        assert v["tmrnet_vs_single"].verdict == stats.REPRODUCED  # 4x check passed
        assert v["adapt_vs_none"].verdict == stats.UNDERFIT and v["self_term"].verdict == stats.UNDERFIT
        assert "adapt_full: still moving on 3 of 3 seeds (its own curve)" in v["adapt_vs_none"].why
    assert "changed by up to -0.100 dB over the last 20% of its steps (since step 320; allowed ±0.032" in (
        v["adapt_vs_none"].why
    )
    # the other adaptation (adapt_noself, saturated) is gated on its own curve too, and reads converged
    reading = adaptation_converged(_adapt(tmp_path, "adapt_noself", 0.1), "adapt_noself")
    assert reading[0] and "since step 0 (mean of 3 seeds)" in reading[1]


def test_a_converged_adaptation_that_lowers_psnr_reads_not_reproduced(spec: ClaimSpec, tmp_path: Path):
    v = _judge(spec, _with_adaptation(tmp_path, _adapt(tmp_path, "adapt_full", -0.2)), tmp_path)
    assert v["adapt_vs_none"].verdict == stats.NOT_REPRODUCED and v["adapt_vs_none"].hi < 0


def test_the_gate_rule_at_its_threshold():
    curve = [(0, 25.0), (320, 25.5)]
    for late, ok in ((ADAPT_FLAT * 0.99, True), (ADAPT_FLAT * 1.01, False), (-ADAPT_FLAT * 1.01, False)):
        rec = RunRecord(Path("."), "adapt_full", 0, {}, {"val/psnr": [*curve, (400, 25.5 + late)]})
        assert adaptation_converged([rec], "adapt_full")[0] is ok
    assert abs(ADAPT_FLAT - 0.2 * math.log(1.25) / math.log(4)) < 1e-12 and 0.032 < ADAPT_FLAT < 0.0325
    # on every seed: one seed up and one down by more than the tolerance is not converged, though their mean is 0
    both = [
        RunRecord(Path("."), "adapt_full", s, {}, {"val/psnr": [*curve, (400, 25.5 + d)]})
        for s, d in enumerate((0.05, -0.05))
    ]
    assert adaptation_converged(both, "adapt_full")[0] is False
    one = RunRecord(Path("."), "adapt_full", 0, {}, {"val/psnr": [(400, 25.0)]})  # no start recorded, one point
    assert adaptation_converged([one], "adapt_full") == (False, "fewer than two validation points: cannot be judged")


def test_the_lr_sweep_table(spec: ClaimSpec, tmp_path: Path):
    recs = _with_adaptation(tmp_path, _adapt(tmp_path, "adapt_full", 0.3, lr=7.5e-5))
    recs += _adapt(tmp_path, "adapt_lr_div10", 0.05) + _adapt(tmp_path, "adapt_lr_x10", -0.4, moving=True)
    tables = {t.title: t for t in claim_report(recs, spec, tmp_path).tables}
    rows = tables["Self-supervised adaptation: learning-rate sweep (shifted domain, test split)"].rows
    assert [r[0] for r in rows] == ["adapt_lr_div10", "adapt_full", "adapt_lr_x10", "adapt_noself"]
    before = "20.5 ± 0.5 (n=3)"
    assert rows[0][1:5] == ["7.5e-06", "1", before, "20.56 ± 0.51 (n=3)"]
    assert rows[1][1:3] == ["7.5e-05 (official)", "1"] and rows[1][5].startswith("+0.31 [")
    assert rows[2][5].startswith("-0.39 [") and rows[2][6].startswith("no: still moving")
    assert rows[3][1:3] == ["7.5e-05 (official)", "0"] and rows[0][6].startswith("yes: converged (its own curve)")


def test_the_example_figures_are_copied_and_their_absence_is_a_note(spec: ClaimSpec, tmp_path: Path):
    recs = _records(tmp_path, alpha=0.3)
    out = tmp_path / "page"
    out.mkdir()
    result = claim_report(recs, spec, out)
    assert not result.figures and any("`tmrnet`" in n and "not in the run folders" in n for n in result.notes)
    folder = tmp_path / "tmrnet" / "0"
    folder.mkdir(parents=True)
    (folder / "bracketire_examples.png").write_bytes(b"\x89PNG")
    result = claim_report(recs, spec, out)
    assert [f.path.name for f in result.figures] == ["bracketire_examples_tmrnet.png"]
    assert (out / "bracketire_examples_tmrnet.png").read_bytes() == b"\x89PNG"
    (folder / "bracketire_examples.png").unlink()  # rebuilt from the data file: the copy beside the page stays
    assert [f.path.name for f in claim_report(recs, spec, out).figures] == ["bracketire_examples_tmrnet.png"]


def test_the_sweep_entries_of_the_spec_run_the_hooks_lrs_from_the_official_adaptation_config(tmp_path: Path):
    from suite.claim import entry_command
    from tests.conftest import compose_train

    spec = load_spec("bracketire")
    runs = {e["name"]: e for e in spec["runs"]}
    assert set(ADAPTED) <= set(runs) and set(SWEEP) <= set(ADAPTED)
    assert compose_train(["experiment=bracketire", "model=bracketire_adapt"], tmp_path).model.optimizer.lr == 7.5e-5
    for name in ADAPTED:
        cmd = entry_command("bracketire", runs[name], spec, tmp_path, [])
        overrides = [
            o.replace("${hydra:job.num}", "0")
            for o in cmd[cmd.index("experiment=bracketire") :]
            if not o.startswith(("hydra.", "seed=", "logger=", "trainer.enable"))
        ]
        cfg = compose_train(overrides, tmp_path)
        assert (cfg.model.mode, cfg.model.w_self) == ("adapt", 0.0 if name == "adapt_noself" else 1.0)
        assert cfg.model.optimizer.lr == SWEEP.get(name, SWEEP["adapt_full"]), name
        assert cfg.model.scheduler.min_factor == 1  # constant lr: the gate reads the curve's end
        assert cfg.trainer.max_steps == 400 and cfg.trainer.val_check_interval == 40
        assert cfg.test_weights == "final"  # evaluate: last, the final weights the gate reads
