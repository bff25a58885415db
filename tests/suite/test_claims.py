"""Claims as data (suite.claims), results kept as data (suite.results_data) and the claim runner's scheduling
(suite.claim: --jobs order, evaluate: best), on hand-made records."""

from __future__ import annotations

import json
import math

import pytest

from core.errors import ConfigError
from suite import claim as claim_mod
from suite import results_data, stats
from suite.claims import (
    ClaimResult,
    ClaimSpec,
    apply_holm,
    apply_weak_baselines,
    default_paired,
    judge,
    judge_values,
    parse_claims,
)
from suite.compare import RunRecord

RUNS = [{"name": "m"}, {"name": "b"}]


def _rec(name, seed, value, data_seed=True, curve=None):
    config = {"seed": seed, "data": {"seed": seed}} if data_seed else {"seed": seed, "data": {"split_seed": 42}}
    return RunRecord(
        None, name, seed, {"test/acc": value}, {"val/acc": curve or [(0, 0.1), (50, 0.8), (100, 0.8)]}, config
    )


def _claim(**kw):
    base = {"id": "c", "text": "m beats b", "metric": "test/acc", "entries": ["m", "b"], "higher_is_better": True}
    return parse_claims({"runs": RUNS, "claims": [base | kw]})[0]


def test_parse_claims_names_the_bad_key():
    assert _claim().kind == "superiority" and _claim(delta=0.1).delta == 0.1
    for bad, match in [
        ({"metrc": "x"}, "unknown keys"),
        ({"entries": ["m", "nope"]}, "not runs"),
        ({"entries": ["m", "m"]}, "two different"),
        ({"kind": "better"}, "kind="),
        ({"delta": -1}, "delta="),
        ({"kind": "non_inferior"}, "margin delta > 0"),
        ({"higher_is_better": "yes"}, "true or false"),
    ]:
        with pytest.raises(ConfigError, match=match):
            _claim(**bad)
    base = {"id": "c", "text": "t", "metric": "x", "entries": ["m", "b"], "higher_is_better": True}
    with pytest.raises(ConfigError, match="appears twice"):
        parse_claims({"runs": RUNS, "claims": [base, base]})
    with pytest.raises(ConfigError, match="lacks"):
        parse_claims({"runs": RUNS, "claims": [{"id": "x"}]})


def test_default_pairing_needs_the_same_seeds_and_data_that_follow_the_seed():
    recs = [_rec("m", s, 0.8) for s in range(3)] + [_rec("b", s, 0.7) for s in range(3)]
    assert default_paired(recs, "m", "b")
    assert not default_paired(recs[:2] + recs[3:], "m", "b")  # seed 2 of m missing
    fixed = [_rec("m", s, 0.8, data_seed=False) for s in range(3)] + recs[3:]
    assert not default_paired(fixed, "m", "b")  # m's data do not depend on its seed: Welch


def test_judge_pairs_by_seed_where_the_data_are_shared():
    # every seed moves both entries together: paired decides, Welch cannot
    shift = [0.0, 0.1, -0.1, 0.05]
    recs = [_rec("m", s, 0.80 + d) for s, d in enumerate(shift)]
    recs += [
        _rec("b", s, 0.78 + d + j) for s, (d, j) in enumerate(zip(shift, (0.001, -0.002, 0.0, 0.001), strict=True))
    ]
    paired = judge(_claim(), recs)
    assert paired.paired and paired.verdict == stats.REPRODUCED and paired.lo == pytest.approx(0.0175, abs=1e-3)
    welch = judge(_claim(paired=False), recs)
    assert not welch.paired and welch.verdict == stats.NOISE and welch.seeds_needed is None
    welch = judge(_claim(paired=False, delta=0.01), recs)
    assert welch.seeds_needed is not None and welch.seeds_needed > 4
    assert paired.values["m"] == pytest.approx({"0": 0.8, "1": 0.9, "2": 0.7, "3": 0.85})
    assert paired.values["b"] == pytest.approx({"0": 0.781, "1": 0.878, "2": 0.68, "3": 0.831})


def test_underfit_and_absent_take_precedence_and_keep_the_interval():
    recs = [_rec("m", s, 0.9 + 0.01 * s) for s in range(3)] + [_rec("b", s, 0.5 + 0.013 * s) for s in range(3)]
    conv = {"m": (True, "converged"), "b": (False, "still improving: +0.2")}
    res = judge(_claim(), recs, conv)
    assert res.verdict == stats.UNDERFIT and "b: still improving" in res.why and res.diff == pytest.approx(0.397)
    assert res.why.endswith("the interval alone reads `reproduced`")
    assert judge(_claim(converge=["m"]), recs, conv).verdict == stats.REPRODUCED  # only m's convergence is needed
    res = judge(_claim(), recs, conv, absent="no outliers")
    assert res.verdict == stats.ABSENT and res.why.startswith("no outliers; the interval alone reads")
    one = judge_values(_claim(), {"0": 0.9}, {"0": 0.5}, paired=False)
    assert one.verdict == stats.NOISE and "at least 2 seeds" in one.why
    exact = judge_values(_claim(deterministic=True), {"0": 0.9}, {"0": 0.5}, paired=False)
    assert exact.verdict == stats.REPRODUCED and exact.lo == exact.hi == pytest.approx(0.4)


def test_holm_across_primaries_only():
    def res(id, p, primary=True, verdict=stats.REPRODUCED):
        return ClaimResult(id=id, text=id, verdict=verdict, primary=primary, p=p)

    out = apply_holm([res("a", 0.01), res("b", 0.03), res("c", 0.04, primary=False)])
    assert [r.p_holm for r in out] == [pytest.approx(0.02), pytest.approx(0.03), None]
    assert [r.verdict for r in out] == [stats.REPRODUCED, stats.REPRODUCED, stats.REPRODUCED]
    out = apply_holm([res("a", 0.01), res("b", 0.03), res("d", 0.2, verdict=stats.NOISE)])
    assert out[1].verdict == stats.NOISE and "Holm" in out[1].why  # 0.03 * 2 = 0.06 >= 0.05
    assert out[0].verdict == stats.REPRODUCED and out[0].p_holm == pytest.approx(0.03)


def test_weak_baseline_flips_only_reproduced_against_it():
    recs = [_rec("m", s, 0.9 + 0.01 * s) for s in range(3)] + [_rec("b", s, 0.5 + 0.013 * s) for s in range(3)]
    won, lost = judge(_claim(), recs), judge(_claim(id="d", entries=["b", "m"]), recs)
    out, notes = apply_weak_baselines([won, lost], {"b": "ends no better than its start"})
    assert out[0].verdict == stats.WEAK and notes == ["`c`: `b` ends no better than its start"]
    assert out[1].verdict == stats.NOT_REPRODUCED  # "d": b beats m, read against m (not weak)
    out, _ = apply_weak_baselines([won], {"m": "weak"})
    assert out[0].verdict == stats.REPRODUCED


def test_claim_spec_convergence_and_errors():
    spec = ClaimSpec.from_dict(
        "demo",
        {
            "runs": RUNS,
            "sizing_metric": "val/acc",
            "sizing_higher_is_better": True,
            "converge": {"tol": 0.05},
            "sizing_untrained": {"b": "an exact score"},
        },
    )
    rising = [(0, 0.1), (50, 0.5), (80, 0.6), (100, 0.7)]
    recs = [_rec("m", 0, 0.9, curve=rising), _rec("b", 0, 0.5, curve=[])]
    conv = spec.convergence(recs)
    assert conv["m"][0] is False and conv["b"] == (True, "trains nothing: an exact score")
    loose = ClaimSpec.from_dict(
        "demo", {"runs": RUNS, "sizing_metric": "val/acc", "sizing_higher_is_better": True, "converge": {"tol": 0.2}}
    )
    assert loose.convergence(recs)["m"][0] is True
    for bad, match in [({"converge": {"tl": 1}}, "converge="), ({"evaluate": "final"}, "evaluate=")]:
        with pytest.raises(ConfigError, match=match):
            ClaimSpec.from_dict("demo", {"runs": RUNS, **bad})


def test_data_file_round_trip_keeps_the_best_point(tmp_path):
    long_curve = [(i, 0.5 + 0.4 * math.sin(i / 50)) for i in range(1000)]  # best near step 78
    best_step = max(long_curve, key=lambda p: p[1])[0]
    run = tmp_path / "run"
    run.mkdir()
    (run / "calib.json").write_text('{"scale": 2}')
    recs = [
        RunRecord(
            run,
            "m",
            0,
            {"test/acc": 0.9, "val/acc@start": 0.1, "test/nan": math.nan},
            {"val/acc": long_curve, "train/loss": [(0, 1.0)], "other/x": [(0, 1.0)]},
            {"seed": 0, "data": {"seed": 0}, "model": {"d": 4}, "paths": {"x": "/machine/path"}},
        ),
        RunRecord(run, "b", 0, {"test/acc": 0.5}, {}, {"seed": 0, "data": {"seed": 0}}),
    ]
    spec = {"runs": RUNS, "sizing_metric": "val/acc", "sizing_higher_is_better": True, "data_files": ["calib.json"]}
    data = results_data.build("demo", spec, recs, {"m": (0, 12.5)})
    path = results_data.write(tmp_path / "data" / "demo.json", data)
    loaded = results_data.load(path)
    assert json.loads(path.read_text()) == loaded and loaded["status"] == {"m": [0, 12.5]}
    m = loaded["runs"][0]
    assert len(m["curves"]["val/acc"]) <= results_data.MAX_POINTS and "other/x" not in m["curves"]
    assert best_step in [s for s, _ in m["curves"]["val/acc"]] and m["metrics"]["test/nan"] is None
    assert "paths" not in loaded["entries"]["m"]["config"]  # no machine paths in the data
    back = results_data.records_from(loaded, tmp_path / "files")
    assert [(r.name, r.seed) for r in back] == [("m", 0), ("b", 0)]
    assert back[0].metrics["test/acc"] == 0.9 and math.isnan(back[0].metrics["test/nan"])
    assert (back[0].path / "calib.json").read_text() == '{"scale": 2}'
    assert back[0].config["data"]["seed"] == 0 and default_paired(back, "m", "b")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(results_data.DataFileError, match="not a results data file"):
        results_data.load(tmp_path / "bad.json")


def test_jobs_order_and_waves():
    spec = {
        "runs": [{"name": "a"}, {"name": "slow"}, {"name": "test_a", "overrides": "ckpt_path=x/../a/0/last.ckpt"}],
        "seeds": [0, 1],
    }
    status = {"a": (0, 20.0), "slow": (0, 200.0)}
    pairs = [(e, s) for e in spec["runs"] for s in (0, 1)]
    order = [(e["name"], s) for e, s in claim_mod.longest_first(pairs, spec, status)]
    assert order[:2] == [("test_a", 0), ("test_a", 1)]  # never run: unknown cost, first
    assert order[2:] == [("slow", 0), ("slow", 1), ("a", 0), ("a", 1)]
    names = [e["name"] for e in spec["runs"]]
    assert claim_mod.depends_on(spec["runs"][2], names) == ["a"] and claim_mod.depends_on(spec["runs"][0], names) == []


def test_evaluate_best_tests_the_best_validation_checkpoint():
    spec = {
        "runs": [{"name": "net"}, {"name": "exact"}],
        "sizing_metric": "val/acc",
        "sizing_higher_is_better": True,
        "sizing_untrained": {"exact": "closed form"},
    }
    over = claim_mod.evaluate_overrides(spec["runs"][0], spec)
    assert over == [
        "callbacks.model_checkpoint.monitor=val/acc",
        "callbacks.model_checkpoint.mode=max",
        "test_weights=best",
    ]
    assert claim_mod.evaluate_overrides(spec["runs"][1], spec) == []
    assert claim_mod.evaluate_overrides(spec["runs"][0], spec | {"evaluate": "last"}) == []
    assert claim_mod.evaluate_overrides(spec["runs"][0], spec | {"sizing_metric": "train/nll"}) == []
    cmd = claim_mod.entry_command("x", spec["runs"][0], spec, claim_mod.ROOT / "out", ["test_weights=final"])
    assert "test_weights=final" in cmd and "test_weights=best" not in cmd  # the user's override wins


def _all_specs():
    root = claim_mod.ROOT / "conf" / "claim"
    for profile, folder in (("cpu", root), ("gpu", root / "gpu"), ("paper", root / "paper")):
        for f in sorted(folder.glob("*.yaml")):
            yield profile, f.stem


@pytest.mark.parametrize(("profile", "slug"), list(_all_specs()))
def test_every_spec_declares_valid_claims_and_a_data_hook(profile, slug):
    import inspect

    spec = claim_mod.load_spec(slug, profile=profile)  # parses claims, converge, evaluate: one line on a bad key
    cspec = ClaimSpec.from_dict(slug, spec)
    names = {e["name"] for e in spec["runs"]}
    assert all(set(c.entries) <= names for c in cspec.claims)
    if spec.get("report"):
        mod, fn = spec["report"].split(":")
        params = list(inspect.signature(getattr(__import__(mod, fromlist=[fn]), fn)).parameters)
        assert params[:3] == ["records", "spec", "out_dir"], f"{spec['report']}: hook(records, spec, out_dir)"


def test_make_claim_jobs_and_plan_as_typed(tmp_path):
    import subprocess

    def make(*args):
        return subprocess.run(
            ["make", "-s", "--no-print-directory", *args],
            cwd=claim_mod.ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )

    dry = make("-n", "claim", "METHOD=stickbreaking", "JOBS=2")
    assert dry.returncode == 0 and "-m suite.claim stickbreaking  --jobs 2" in dry.stdout
    # --plan reads the committed data file when no runs are on disk (a fresh clone), and runs nothing
    plan = make("claim", "METHOD=stickbreaking", f"ARGS=--plan --out {tmp_path / 'none'}")
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert "sb_vs_rope_8x" in plan.stdout and "seeds needed" in plan.stdout
    assert not (tmp_path / "none").exists()


def test_two_metrics_of_one_entry_pair_by_seed():
    # a forecast scored beside copy-last inside the same runs: one entry, two metrics, paired by construction
    recs = [
        RunRecord(None, "m", s, {"test/miou": 0.40 + d, "test/miou_copy": 0.37 + d + j}, {}, {"seed": s})
        for s, (d, j) in enumerate(((0.0, 0.001), (0.05, -0.002), (-0.04, 0.0), (0.02, 0.001)))
    ]
    spec = {
        "runs": [{"name": "m"}],
        "claims": [
            {
                "id": "fc",
                "text": "forecast beats copy-last",
                "metric": "test/miou",
                "baseline_metric": "test/miou_copy",
                "entries": ["m", "m"],
                "higher_is_better": True,
                "delta": 0.01,
            }
        ],
    }
    (claim,) = parse_claims(spec)
    res = judge(claim, recs)
    assert res.paired and res.verdict == stats.REPRODUCED and res.diff == pytest.approx(0.03)
    # seeds that agree exactly are no evidence of an exact result unless the claim says so
    same = [
        RunRecord(None, "m", s, {"test/miou": 0.4 + d, "test/miou_copy": 0.37 + d}, {}, {"seed": s})
        for s, d in enumerate((0.0, 0.05, -0.04))
    ]
    res = judge(claim, same)
    assert res.verdict == stats.NOISE and "sign test needs at least 6 agreeing seeds (p = 0.25 with 3)" in res.why
    # six seeds that all agree: the exact sign test decides (p = 2 / 2**6 = 0.031)
    six = [
        RunRecord(None, "m", s, {"test/miou": 0.4 + d, "test/miou_copy": 0.37 + d}, {}, {"seed": s})
        for s, d in enumerate((0.0, 0.05, -0.04, 0.01, 0.02, -0.01))
    ]
    res = judge(claim, six)
    assert res.verdict == stats.REPRODUCED and res.p == pytest.approx(0.03125) and res.p_against == "sign test"
    below = parse_claims({**spec, "claims": [{**spec["claims"][0], "delta": 0.05}]})[0]
    assert judge(below, six).verdict == stats.NOT_REPRODUCED  # every seed agrees on an effect smaller than delta
    assert set(res.values) == {"m:test/miou", "m:test/miou_copy"} and res.metric == "test/miou vs test/miou_copy"
    with pytest.raises(ConfigError, match="baseline_metric"):
        parse_claims({**spec, "claims": [{**spec["claims"][0], "baseline_metric": None}]})


def test_downsampling_keeps_the_convergence_reading_and_paths_are_scrubbed(tmp_path):
    # flat at 0.5 with a 0.9 peak just before the window and 0.905 inside it: converged (gain 0.005 <= 1%)
    curve = [(i, 0.5) for i in range(1000)]
    curve[703], curve[950] = (703, 0.9), (950, 0.905)
    full = stats.converged([curve], higher_is_better=True)
    kept = results_data.downsample(curve)
    assert len(kept) <= results_data.MAX_POINTS + 4
    again = stats.converged([[tuple(p) for p in kept]], higher_is_better=True)
    assert full.ok and again.ok and again.gains == pytest.approx(full.gains)
    low = [(s, -v) for s, v in curve]  # the same curve read as a loss: the lowest points are kept too
    back = stats.converged([[tuple(p) for p in results_data.downsample(low)]], higher_is_better=False)
    assert back.gains == pytest.approx(stats.converged([low], higher_is_better=False).gains)
    root = tmp_path / "repo"
    config = {"trainer": {"default_root_dir": str(root / "logs"), "x": [str(root / "a/b"), "/home/someone/data"]}}
    assert results_data.scrub(config, root) == {"trainer": {"x": ["a/b", "<path>"]}}


def test_overview_counts_come_from_the_data_files(tmp_path):
    from suite.claims import ClaimResult

    (tmp_path / "data").mkdir()
    for slug in ("rebuilt", "former"):
        (tmp_path / f"{slug}.md").write_text(f"# Claim check: {slug}\n")
    (tmp_path / "rebuilt_notes.md").write_text("notes")
    data = results_data.build("rebuilt", {"runs": RUNS}, [], {})
    data["claims"] = [ClaimResult("a", "a", stats.REPRODUCED).to_dict(), ClaimResult("b", "b", stats.NOISE).to_dict()]
    results_data.write(tmp_path / "data" / "rebuilt.json", data)
    text = results_data.overview(tmp_path)
    assert "| [rebuilt](rebuilt.md) | 1 | 0 | 0 | 0 | 1 | 0 | current |" in text
    assert "| [former](former.md) |" in text and "former: rerun pending" in text and "rebuilt_notes" not in text


def test_bad_convergence_keys_and_flags_fail_at_load():
    for conv in ({"frac": 1.5}, {"frac": 0}, {"rel": -0.1}, {"tol": "x"}):
        with pytest.raises(ConfigError, match="converge"):
            ClaimSpec.from_dict("demo", {"runs": RUNS, "converge": conv})
    with pytest.raises(ConfigError, match="paired='yes' must be true or false"):
        _claim(paired="yes")


def test_a_dependent_entry_never_runs_after_its_source_failed(tmp_path, monkeypatch):
    ran = []

    def fake(slug, entry, spec, out, extra, seed=None):
        ran.append((entry["name"], seed))
        return (1 if entry["name"] == "a" and seed == 0 else 0), 0.1

    monkeypatch.setattr(claim_mod, "run_entry", fake)
    spec = {"runs": [{"name": "a"}, {"name": "t", "overrides": "ckpt_path=x/../a/0/last.ckpt"}], "seeds": [0, 1]}
    pairs = [(e, s) for e in spec["runs"] for s in (0, 1)]
    failures = claim_mod.run_pairs("x", pairs, spec, tmp_path, [], tmp_path / "status.json", jobs=2)
    assert ("t", 0) not in ran and ("t", 1) in ran
    assert "a@seed=0" in failures and "t@seed=0 (not run: its source failed)" in failures


def test_overview_sets_each_page_beside_the_papers_budget():
    text = results_data.overview(claim_mod.ROOT / "docs" / "results")
    budget = text.split("## Budget: the paper's and the one run here")[1]
    row = next(line for line in budget.splitlines() if line.startswith("| stickbreaking |"))
    assert "1B and 3B parameters" in row and "2 layers, d=64" in row  # conf/claim/stickbreaking.yaml's budget
