"""suite.report and the claim page: the comparison rule on value lists, the convergence reading, longer-run checks,
the budget table, and the page built from declared claims and a hook's data, on hand-made numbers."""

from __future__ import annotations

import pytest

from core.errors import ConfigError
from suite import claim, report
from suite.compare import RunRecord
from suite.report import (
    NOISE,
    NOT_REPRODUCED,
    REPRODUCED,
    UNDERFIT,
    apply_longer_checks,
    budget_table,
    compare,
    longer_checks,
    longer_run_check,
    main_runs,
    plateau,
)


def test_a_verdict_outside_the_vocabulary_is_refused():
    from suite.claims import ClaimResult

    with pytest.raises(ValueError, match="not one of"):
        ClaimResult("x", "x", "partly reproduced")


def test_compare_uses_the_standard_error_of_the_difference():
    # means 0.9 vs 0.8, sd 0.01 each over 3 seeds: s.e. = sqrt(2 * 1e-4 / 3) = 0.00816, margin 0.1 >> 2 s.e.
    assert compare([0.89, 0.90, 0.91], [0.79, 0.80, 0.81], higher_is_better=True) == REPRODUCED
    assert compare([0.89, 0.90, 0.91], [0.79, 0.80, 0.81], higher_is_better=False) == NOT_REPRODUCED
    # margin 0.02 vs 2 s.e. = 2 * sqrt(2 * 0.0004 / 3) = 0.0327: within noise
    assert compare([0.80, 0.82, 0.84], [0.78, 0.80, 0.82], higher_is_better=True) == NOISE
    # same margin with 3x tighter seeds: 2 s.e. = 0.0109 < 0.02
    assert compare([0.813, 0.82, 0.827], [0.793, 0.80, 0.807], higher_is_better=True) == REPRODUCED
    assert compare([0.9], [0.1], higher_is_better=True, converged=False) == UNDERFIT
    # one value each: a 1% relative margin decides (deterministic fits)
    assert compare([1.0], [1.005], higher_is_better=False) == NOISE
    assert compare([1.0], [1.02], higher_is_better=False) == REPRODUCED


def test_plateau_is_the_best_so_far_rule_never_the_seed_spread():
    # 10 points, steps 0..900: the window starts at step 720; both seeds flat since step 300: converged at their best
    flat = [[(100 * i, 1.0 - 0.5 * (i < 3)) for i in range(10)] for _ in range(2)]
    flat[1] = [(s, v + 0.1) for s, v in flat[1]]
    ok, why = plateau(flat, higher_is_better=True)
    assert ok and why.startswith("converged") and "best at step 300, 300" in why
    # rising by 0.2 over the window: still improving, however far apart the seeds are
    rising = [[(100 * i, 0.1 * i + d) for i in range(10)] for d in (0.0, 0.5)]
    ok, why = plateau(rising, higher_is_better=True)
    assert not ok and why.startswith("still improving: the best-so-far value gained 0.2")
    # a loss still falling is improving when lower is better; read as an accuracy that fell, it peaked at the start
    falling = [[3.0, 2.0, 1.5, 1.2]]
    assert plateau(falling, higher_is_better=False)[0] is False
    assert plateau(falling, higher_is_better=True)[0] is True
    # a 1% relative tolerance by default (0.5% gain over the last window = converged), or a declared one
    assert plateau([[2.0, 1.01, 1.005, 1.0]], frac=0.3, higher_is_better=False)[0] is True
    assert plateau([[2.0, 1.01, 1.005, 1.0]], frac=0.3, higher_is_better=False, tol=0.001)[0] is False
    assert plateau([[0.5]], higher_is_better=True) == (False, "fewer than two validation points: cannot be judged")
    assert plateau([], higher_is_better=True)[0] is False


def test_longer_run_check_pairs_one_seed_and_measures_against_the_seed_spread(tmp_path):
    recs = [RunRecord(tmp_path, "m", s, {"test/mae": v}) for s, v in ((0, 0.50), (1, 0.52), (2, 0.48))]  # sd 0.02
    assert longer_run_check(recs, "m", "test/mae", higher_is_better=False) is None  # no longer run
    near = [*recs, RunRecord(tmp_path, "m_long", 0, {"test/mae": 0.49})]  # improves by 0.01 < 0.02
    ok, why = longer_run_check(near, "m", "test/mae", higher_is_better=False)
    assert not ok and why == (  # 0.01 is more than 1% of the value (0.005): the seed spread is not the tolerance
        "not converged: the longer run (m_long) improves test/mae by 0.01 on seed 0 (0.5 -> 0.49; allowed: 1% of "
        "the value, 0.005)"
    )
    assert longer_run_check(near, "m", "test/mae", higher_is_better=False, tol=0.02)[0] is True  # a declared tolerance
    near = [*recs, RunRecord(tmp_path, "m_long", 0, {"test/mae": 0.497})]  # improves by 0.003 < 0.005
    assert longer_run_check(near, "m", "test/mae", higher_is_better=False)[0] is True
    far = [*recs, RunRecord(tmp_path, "m_long", 0, {"test/mae": 0.45})]  # improves by 0.05 > 0.005
    assert longer_run_check(far, "m", "test/mae", higher_is_better=False)[0] is False
    # the same numbers with higher-is-better: the longer run got worse, which is no sign of underfitting
    ok, why = longer_run_check(far, "m", "test/mae", higher_is_better=True)
    assert ok and "worsens test/mae by 0.05" in why
    # two-sided: a move by more than the tolerance either way is no convergence; within it, either way, is
    ok, why = longer_run_check(far, "m", "test/mae", higher_is_better=True, two_sided=True)
    assert not ok and "worsens test/mae by 0.05" in why
    assert longer_run_check(near, "m", "test/mae", higher_is_better=True, two_sided=True)[0]
    assert longer_run_check(near, "m", "test/mae", higher_is_better=False, two_sided=True)[0]
    # a fixed tolerance and a unit; seed 1's main value must not be the reference
    psnr = [
        RunRecord(tmp_path, "t", 1, {"test/psnr": 10.0}),
        RunRecord(tmp_path, "t", 0, {"test/psnr": 20.0}),
        RunRecord(tmp_path, "t_long", 0, {"test/psnr": 20.3}),
    ]
    ok, why = longer_run_check(psnr, "t", "test/psnr", higher_is_better=True, tol=0.2, unit=" dB")
    assert not ok and "improves test/psnr by 0.3 dB" in why and "allowed: 0.2 dB" in why
    # one seed: 1% of the value (0.005) is the tolerance, and the reading says so
    one_seed = [RunRecord(tmp_path, "u", 0, {"r2": 0.5}), RunRecord(tmp_path, "u_long", 0, {"r2": 0.504})]
    ok, why = longer_run_check(one_seed, "u", "r2", higher_is_better=True)
    assert ok and "allowed: 1% of the value, 0.005" in why
    # no seed-0 main run: nothing to pair with; a diverged longer run shows no convergence
    assert (
        longer_run_check([RunRecord(tmp_path, "u", 1, {"r2": 0.5}), one_seed[1]], "u", "r2", higher_is_better=True)
        is None
    )
    nan = [one_seed[0], RunRecord(tmp_path, "u_long", 0, {"r2": float("nan")})]
    ok, why = longer_run_check(nan, "u", "r2", higher_is_better=True)
    assert not ok and "not finite" in why


def test_longer_run_check_averages_the_paired_gains_of_every_seed_with_a_longer_run(tmp_path):
    main = [RunRecord(tmp_path, "s", i, {"acc": v}) for i, v in ((0, 0.66), (1, 0.70), (2, 0.74))]  # sd 0.04
    longer = [RunRecord(tmp_path, "s_long", i, {"acc": v}) for i, v in ((0, 0.695), (1, 0.75), (2, 0.79))]
    ok, why = longer_run_check([*main, *longer], "s", "acc", higher_is_better=True)
    # the mean of the three paired gains is 0.045 (> 1% of the value, 0.007)
    assert not ok and why == (
        "not converged: the longer run (s_long) improves acc by 0.045 on average on seeds 0, 1, 2 (mean 0.7 -> 0.745; "
        "change per seed +0.035, +0.05, +0.05; allowed: 1% of the value, 0.007)"
    )
    # lower is better: the same numbers are a worsening, and each seed's change keeps its own sign
    ok, why = longer_run_check([*main, *longer], "s", "acc", higher_is_better=False)
    assert ok and "worsens acc by 0.045 on average" in why and "change per seed +0.035, +0.05, +0.05" in why
    assert longer_run_check([*main, *longer], "s", "acc", higher_is_better=True, seed=0, tol=0.04)[0] is True
    # a seed without its main run is not paired
    ok, why = longer_run_check([*main[:1], *longer], "s", "acc", higher_is_better=True)
    assert "on seed 0 (0.66 -> 0.695" in why
    # one diverged longer run among several: not shown converged
    bad = [*main, *longer[:2], RunRecord(tmp_path, "s_long", 2, {"acc": float("nan")})]
    ok, why = longer_run_check(bad, "s", "acc", higher_is_better=True)
    assert not ok and "(seeds 0, 1, 2) is not finite" in why
    assert main_runs([*main, *longer]) == main  # the longer runs only enter the checks
    lone = [RunRecord(tmp_path, "sequence_long", 0, {"acc": 0.5})]  # ends in the suffix, but no `sequence` entry
    assert main_runs([*main, *lone]) == [*main, *lone]


def test_budget_table_rows_are_the_union_of_keys():
    table = budget_table(
        {"paper": {"model": "1.3B", "steps": "100B tokens"}, "here": {"model": "96k params", "data": "1000 seq"}}
    )
    assert table.splitlines() == [
        "| | paper | here |",
        "|---|---|---|",
        "| model | 1.3B | 96k params |",
        "| steps | 100B tokens | — |",
        "| data | — | 1000 seq |",
    ]
    assert "No `budget:`" in budget_table(None)


def test_sizing_groups_records_by_entry():
    recs = [
        RunRecord(path=None, name="a", seed=s, curves={"val/loss": [(0, 2.0), (50, 1.0), (100, 1.0 + s / 100)]})
        for s in range(3)
    ] + [RunRecord(path=None, name="b", seed=0, curves={"val/loss_epoch": [(0, 2.0), (50, 1.5), (100, 1.0)]})]
    out = report.sizing(recs, "val/loss", higher_is_better=False)
    assert out["a"][0] is True and out["b"][0] is False
    assert report.mean_curve(report.entry_curves(recs, "a", "val/loss"))[-1] == (100, pytest.approx(1.01))


def test_patience_plateau_is_the_early_stopping_rule():
    # best at the 2nd of 5 validations: 3 validations without a new best -> plateaued for patience <= 3, not 4
    stopped = [(400, 0.40), (800, 0.45), (1200, 0.44), (1600, 0.45), (2000, 0.43)]  # a tie is not a new best
    assert report.patience_plateau([stopped], patience=3, higher_is_better=True)[0] is True
    ok, why = report.patience_plateau([stopped], patience=4, higher_is_better=True)
    assert ok is False and why.startswith("still improving: 1 of 1 seed") and "best at step 800" in why
    rising = [(400, 0.40), (800, 0.45), (1200, 0.44), (1600, 0.46)]
    ok, why = report.patience_plateau([stopped, rising], patience=2, higher_is_better=True)
    assert ok is False and "1 of 2 seeds" in why and "last validation at 2000, 1600" in why
    falling_loss = [1.0, 0.5, 0.6, 0.7]  # values in order, lower is better: best at index 1
    assert report.patience_plateau([falling_loss], patience=2, higher_is_better=False)[0] is True
    assert report.patience_plateau([falling_loss], patience=3, higher_is_better=False)[0] is False  # 2 after the best
    assert report.patience_plateau([falling_loss], patience=3, higher_is_better=True)[0] is True  # read as accuracy
    assert report.patience_plateau([[0.5, 0.5]], patience=2, higher_is_better=True)[0] is False  # too short to tell
    assert report.patience_plateau([], patience=2, higher_is_better=True) == (False, "no validation curve logged")
    with pytest.raises(ValueError, match="patience=0"):
        report.patience_plateau([stopped], patience=0, higher_is_better=True)
    noisy = [(400, 0.40), (800, 0.45), (1200, 0.43), (1600, 0.44)]  # checkpoint noise after the best, at 800
    recs = [RunRecord(path=None, name="a", seed=0, curves={"val/r2": noisy})]
    assert report.sizing(recs, "val/r2", higher_is_better=True, patience=2)["a"][0] is True
    # the best-so-far rule: the best (0.45 at step 800) is before the last 20% of training: converged at its best
    assert report.sizing(recs, "val/r2", higher_is_better=True)["a"][0] is True
    assert report.sizing_patience({"sizing_patience": 3}) == 3 and report.sizing_patience({}) is None
    for bad in (0, "3", True, 2.5):
        with pytest.raises(ConfigError, match="sizing_patience"):
            report.sizing_patience({"sizing_patience": bad})


def _hook(records, spec, out_dir):  # a results-page hook: receives the typed spec, returns data
    from suite.claims import Claim, HookResult, Table, judge

    claim = Claim("b_vs_a", "b beats a (a claim the spec cannot declare)", "test/acc", ("b", "a"), True)
    return HookResult(
        verdicts=[judge(claim, records, spec.convergence(records))],
        tables=[Table("Extra", ["entry", "seeds"], [["a", 3]], note="a note")],
    )


SPEC = {
    "runs": [{"name": "a"}, {"name": "b"}],
    "seeds": [0, 1, 2],
    "metrics": ["test/acc"],
    "budget": {"paper": {"model": "1.3B"}, "here": {"model": "96k"}},
    "sizing_metric": "val/loss",
    "sizing_higher_is_better": False,
    "report": "tests.suite.test_report:_hook",
    "claims": [
        {
            "id": "a_vs_b",
            "text": "a beats b",
            "metric": "test/acc",
            "entries": ["a", "b"],
            "higher_is_better": True,
            "delta": 0.05,
            "primary": True,
            "published": 0.3,
        },
    ],
}


def _rec(tmp_path, name, seed, final, acc, data_seed=True):
    curve = [(0, 2.0), (100, final + 0.5), (400, final + 0.001 * seed), (500, final)]
    config = {"seed": seed, "data": {"seed": seed}} if data_seed else {"seed": seed}
    return RunRecord(tmp_path / f"{name}{seed}", name, seed, {"test/acc": acc}, {"val/loss": curve}, config)


def test_write_page_states_declared_and_hook_verdicts_first(tmp_path):
    from suite.claim import write_page

    recs = [_rec(tmp_path, "a", s, 1.0, 0.9 + 0.01 * s) for s in range(3)]
    recs += [_rec(tmp_path, "b", s, 1.2, 0.5 + 0.012 * s) for s in range(3)]
    data = {}
    text = write_page("demo", SPEC, recs, {}, tmp_path, [], tmp_path / "demo.md", data=data).read_text()
    assert text.index("## Verdicts") < text.index("## Runs") < text.index("## Convergence")
    row = next(line for line in text.splitlines() if line.startswith("| a beats b"))
    # per-seed differences 0.4, 0.398, 0.396: a narrow paired interval, the paper's +0.3 beside it
    assert "| **reproduced** | +0.398 [+0.393, +0.403] | 3 | paired | <1e-4 |" in row
    assert "| +0.3 | 0.05 |" in row
    assert "| b beats a (a claim the spec cannot declare) (`b_vs_a`, exploratory) | **not reproduced** |" in text
    assert "| `a_vs_b` | a | test/acc | 0: 0.9, 1: 0.91, 2: 0.92 |" in text
    assert "## Extra" in text and "a note" in text
    assert "| model | 1.3B | 96k |" in text and "| a | yes | converged" in text
    assert [c["id"] for c in data["claims"]] == ["a_vs_b", "b_vs_a"] and data["claims"][0]["paired"] is True
    assert (tmp_path / "demo_sizing.png").stat().st_size > 1000
    assert "| a | `` | reused | — |" in text
    # one seed a side: no interval, within noise; a loss still falling: underfit; no budget: said so
    one = [RunRecord(tmp_path / "x", "a", 0, {"test/acc": 0.9}, {"val/loss": [(0, 3.0), (50, 2.0), (100, 1.0)]})]
    one.append(RunRecord(tmp_path / "y", "b", 0, {"test/acc": 0.5}, {"val/loss": [(0, 3.0), (100, 2.0)]}))
    text = write_page("demo", SPEC | {"budget": None}, one, {}, tmp_path, [], tmp_path / "one.md").read_text()
    assert "mean ± std" not in text and "(one seed per run: no spread)" in text and "No `budget:`" in text
    assert "| a | no | still improving" in text and "**inconclusive: underfit**" in text
    spec = SPEC | {"runs": [*SPEC["runs"], {"name": "c"}]}  # an entry with no runs on disk and no status: said so
    spec.pop("sizing_metric")
    text = write_page("demo", spec, one, {}, tmp_path, [], tmp_path / "c.md").read_text()
    assert "| c | `` | not run (no runs on disk) | — |" in text and "No `sizing_metric`" in text
    # runs ended by early stopping: the page judges them by the stopping rule and says so
    spec = SPEC | {"sizing_patience": 2}
    text = write_page("demo", spec, recs, {}, tmp_path, [], tmp_path / "es.md").read_text()
    assert "none of its last 2 validations set a new best `val/loss`" in text
    assert "| a | no | still improving: 3 of 3 seeds set a new best in the last 2 validations" in text


def test_a_failing_hook_keeps_the_declared_verdicts(tmp_path):
    from suite.claim import write_page

    recs = [_rec(tmp_path, "a", s, 1.0, 0.9 + 0.01 * s) for s in range(3)]
    recs += [_rec(tmp_path, "b", s, 1.2, 0.5 + 0.02 * s) for s in range(3)]
    spec = SPEC | {"report": "tests.suite.test_report:no_such_hook"}
    text = write_page("demo", spec, recs, {}, tmp_path, [], tmp_path / "f.md").read_text()
    assert "Report hook `tests.suite.test_report:no_such_hook` failed: AttributeError" in text
    assert "| a beats b (`a_vs_b`, primary) | **reproduced** |" in text


def test_apply_longer_checks_overrides_only_failures_and_passes_them_to_inheritors():
    judged = {"a": (True, "plateaued"), "b": (True, "plateaued"), "c": (False, "still improving"), "d": (True, "p")}
    checks = {"a": (False, "not converged: +0.05"), "b": (True, "converged: +0.001"), "c": (True, "converged: 0")}
    out = apply_longer_checks(judged, checks, {"d": ("b", "a"), "zz": ("a",)})
    assert out["a"] == (False, "not converged: +0.05")  # plateaued, but the 4x run still gains
    assert out["b"] == (True, "plateaued")  # a passed check keeps the plateau answer
    assert out["c"] == (False, "still improving")  # and cannot rescue a curve that is still rising
    rising = apply_longer_checks({"e": (False, "still improving")}, {"e": (False, "not converged: +0.1")})
    assert rising["e"] == (False, "still improving; and not converged: +0.1")  # both reasons kept
    assert out["d"] == (False, "a's 4x check: not converged: +0.05")  # the first failed source, not the passed one
    assert "zz" not in out and judged["a"] == (True, "plateaued")  # no entry invented, the input left alone
    assert apply_longer_checks(judged, {}, {"d": ("a",)}) == judged


def test_apply_longer_checks_passed_settles_only_its_own_rising_entry():
    judged = {
        "a": (False, "still improving: +0.009"),
        "b": (True, "plateaued"),
        "c": (False, "still improving"),
        "d": (False, "still improving"),
        "e": (False, "still improving"),
    }
    checks = {"a": (True, "converged: +0.001"), "b": (True, "converged: 0"), "c": (False, "not converged: +0.02")}
    out = apply_longer_checks(judged, checks, {"d": ("a",)}, passed_settles=True)
    assert out["a"] == (True, "still improving: +0.009; but converged: +0.001, which settles it")
    assert out["b"] == (True, "plateaued")  # already plateaued: unchanged
    assert out["c"] == (False, "still improving; and not converged: +0.02")  # a failed check never settles
    assert out["d"] == (False, "still improving")  # an inheritor is not settled by its source's passed check
    assert out["e"] == (False, "still improving")  # no check: the plateau rule alone
    assert apply_longer_checks(judged, checks)["a"] == judged["a"]  # off by default
    bare = {"f": (False, "no validation curve logged")}
    assert apply_longer_checks(bare, {"f": (True, "converged: 0")}, passed_settles=True) == bare  # no curve: unsettled


def test_longer_checks_pairs_every_entry_with_a_longer_run(tmp_path):
    recs = [
        RunRecord(tmp_path, n, 0, {"acc": v}) for n, v in (("b", 0.5), ("b_long", 0.9), ("a", 0.7), ("a_long", 0.7))
    ]
    recs += [RunRecord(tmp_path, "c", 0, {"acc": 0.1}), RunRecord(tmp_path, "d_long", 0, {"acc": 0.2})]  # no pair
    recs += [RunRecord(tmp_path, "e", 0, {"acc": 0.3}), RunRecord(tmp_path, "e_long", 0, {"other": 0.3})]  # no key
    checks = longer_checks(recs, "acc", higher_is_better=True)
    assert list(checks) == ["a", "b"]
    assert checks["a"][0] is True and checks["b"][0] is False  # 1% of 0.5 allowed with one seed; +0.4 is not


def test_sizing_plot_marks_the_tail_that_fewer_seeds_reach(tmp_path, monkeypatch):
    # early stopping ended seed 0 at step 40 and seed 1 at step 60: after step 40 the mean is seed 1's alone
    curves = [[(0, 2.0), (20, 1.5), (40, 1.2)], [(0, 2.2), (20, 1.7), (40, 1.4), (60, 1.3)]]
    assert report.mean_curve(curves, counts=True) == [
        (0, pytest.approx(2.1), 2),
        (20, pytest.approx(1.6), 2),
        (40, pytest.approx(1.3), 2),
        (60, pytest.approx(1.3), 1),
    ]
    recs = [RunRecord(path=None, name="a", seed=s, curves={"val/loss": c}) for s, c in enumerate(curves)]
    import matplotlib.axes

    drawn = []
    real_plot = matplotlib.axes.Axes.plot
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "plot",
        lambda ax, *a, **k: drawn.append((a[0], k.get("lw"))) or real_plot(ax, *a, **k),
    )
    out = claim.plot_sizing(recs, "val/loss", {"a": (True, "")}, tmp_path / "s.png", patience=2)
    assert out is not None and out.stat().st_size > 1000
    assert ((0, 20, 40), 1.2) in drawn  # both seeds: bold
    assert ((40, 60), 0.6) in drawn  # one seed: thin, joined to the bold part


def test_untrained_entries_read_n_a_in_the_sizing_section(tmp_path):
    spec = {
        "runs": [{"name": "exact"}, {"name": "net"}],
        "sizing_metric": "val/loss",
        "sizing_untrained": {"exact": "exact score"},
    }
    recs = [RunRecord(path=None, name="exact", seed=0, curves={}, metrics={"test/err": 0.1})] + [
        RunRecord(path=None, name="net", seed=s, curves={"val/loss": [(0, 2.0), (50, 1.0), (100, 1.0)]})
        for s in range(2)
    ]
    from suite.claims import ClaimSpec

    lines = claim.sizing_section("demo", ClaimSpec.from_dict("demo", spec), recs, tmp_path)
    assert "| exact | n/a | trains nothing: exact score |" in lines
    assert any(line.startswith("| net | yes | converged") for line in lines)
    assert not any(line.startswith("| exact | no") for line in lines)
    with pytest.raises(ConfigError, match="not runs"):
        report.sizing_untrained({**spec, "sizing_untrained": {"exakt": "typo"}})
    with pytest.raises(ConfigError, match="reason"):
        report.sizing_untrained({**spec, "sizing_untrained": ["exact"]})
