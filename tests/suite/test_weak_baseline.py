"""The weak-baseline rule: a claim entry records its headline metric at step 0 (``eval_at_start``), and a verdict
read against a baseline that ends no better than its start or than a trivial reference becomes
``inconclusive: weak baseline``, with a line on the page. Synthetic records, plus two tiny real runs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import ConfigError
from suite.claims import Claim, ClaimResult, apply_weak_baselines, judge
from suite.compare import RunRecord
from suite.report import (
    NOT_REPRODUCED,
    REPRODUCED,
    WEAK,
    baseline_checks,
    baseline_section,
    headline_spec,
    weak_baselines,
)
from suite.rundir import START_FILE
from suite.start_metrics import preserved_rng

SPEC = {
    "runs": [{"name": "ours"}, {"name": "base"}, {"name": "base_exact"}],
    "metrics": ["test/acc"],
    "sizing_metric": "val/acc",
    "sizing_higher_is_better": True,
}


def _runs(name: str, start: float | None, end: float, test: float, seeds: int = 3) -> list[RunRecord]:
    """Seeds of one entry: ``val/acc`` at step 0 (``None``: a run from before the rule) and at the end, test/acc."""
    out = []
    for s in range(seeds):
        m = {"val/acc": end + 0.01 * s, "test/acc": test + 0.01 * s + 0.002 * s * s * (name == "ours")}
        if start is not None:
            m["val/acc@start"] = start + 0.01 * s
        out.append(RunRecord(path=None, name=name, seed=s, metrics=m))
    return out


def _verdict(records, weak=None):
    """The verdict of "ours beats the baseline" on ``records``, with the weak-baseline rule applied for ``weak``."""
    claim = Claim("ours_vs_base", "ours beats the baseline", "test/acc", ("ours", "base"), True)
    results, notes = apply_weak_baselines([judge(claim, records)], weak or {})
    return results[0], notes


def test_a_baseline_that_ends_below_its_start_flips_reproduced_to_weak_baseline():
    records = _runs("ours", 0.1, 0.9, 0.9) + _runs("base", 0.5, 0.3, 0.3)  # base unlearns: 0.5 -> 0.3
    checks = baseline_checks(records, SPEC)
    assert checks["base"].weak is True and "ends no better than its start" in checks["base"].reading
    assert "`val/acc` 0.51 at step 0 -> 0.31 at the end (gain -0.2, 3 seeds)" in checks["base"].reading
    assert _verdict(records)[0].verdict == REPRODUCED  # without the rule the interval reads reproduced
    result, notes = _verdict(records, weak_baselines(checks))
    assert result.verdict == WEAK and "read `reproduced` against `base`" in result.why
    assert notes == ["`ours_vs_base`: `base` " + checks["base"].reading]


def test_a_healthy_baseline_leaves_the_verdict():
    records = _runs("ours", 0.1, 0.9, 0.9) + _runs("base", 0.1, 0.5, 0.5)
    checks = baseline_checks(records, SPEC)
    assert checks["base"].weak is False and "improves on its start" in checks["base"].reading
    result, notes = _verdict(records, weak_baselines(checks))
    assert result.verdict == REPRODUCED and notes == []
    # a gain within the noise of its seeds (or under 1% of the start) is no better than the start
    flat = [RunRecord(None, "base", s, {"val/acc": 0.5 + d, "val/acc@start": 0.5}) for s, d in enumerate((0.02, -0.02))]
    assert baseline_checks(flat, SPEC)["base"].weak is True
    tiny = [RunRecord(None, "base", 0, {"val/acc": 0.502, "val/acc@start": 0.5})]
    assert baseline_checks(tiny, SPEC)["base"].weak is True


def test_a_baseline_no_better_than_a_trivial_reference_is_weak():
    chance = {**SPEC, "headline": {"metric": "test/acc", "reference": {"value": 0.25, "what": "chance (1/4)"}}}
    records = _runs("ours", 0.25, 0.9, 0.9) + _runs("base", 0.1, 0.5, 0.24)  # learns on val, chance on test
    checks = baseline_checks(records, chance)
    assert checks["base"].weak is True
    assert "`test/acc` 0.25 is no better than chance (1/4) (0.25)" in checks["base"].reading
    assert _verdict(records, weak_baselines(checks))[0].verdict == WEAK
    # above chance: healthy; the reference may also be another entry (copy-last, the uniform policy) ...
    assert baseline_checks(_runs("base", 0.1, 0.5, 0.6), chance)["base"].weak is False
    spec = {**SPEC, "runs": [*SPEC["runs"], {"name": "uniform"}], "headline": {"reference": {"entry": "uniform"}}}
    assert baseline_checks(records + _runs("uniform", 0.3, 0.3, 0.31), spec)["base"].weak is False  # val 0.5 > 0.3
    assert baseline_checks(records + _runs("uniform", 0.5, 0.5, 0.5), spec)["base"].weak is True
    # ... or a metric of the same run (a copy-last forecast scored beside the model), lower is better here
    mae = {**SPEC, "headline": {"start": "val/mae", "higher_is_better": False, "reference": {"metric": "test/naive"}}}
    run = RunRecord(None, "base", 0, {"val/mae": 1.0, "val/mae@start": 3.0, "test/naive": 0.9})
    assert "no better than test/naive (0.9)" in baseline_checks([run], mae)["base"].reading
    assert baseline_checks([run], mae)["base"].weak is True


def test_runs_without_a_start_say_so_and_change_no_verdict():
    records = _runs("ours", None, 0.9, 0.9) + _runs("base", None, 0.3, 0.3)  # runs from before the rule
    checks = baseline_checks(records, SPEC)
    assert (
        checks["base"].weak is None and "start not recorded (no `val/acc@start` in its runs)" in checks["base"].reading
    )
    lines, weak = baseline_section(records, SPEC)
    assert weak == {} and "start not recorded, and no verdict is changed by the rule" in "\n".join(lines)
    assert "| base | not judged | start not recorded" in "\n".join(lines)
    assert _verdict(records, weak)[0].verdict == REPRODUCED


def test_only_reproduced_flips_and_only_against_the_named_baseline():
    weak = {"pb_s": "ends no better than its start"}
    lost = ClaimResult("x_vs_pb_s", "x beats pb_s", NOT_REPRODUCED, entries=("x", "pb_s"))
    assert apply_weak_baselines([lost], weak) == ([lost], [])  # losing to a weak baseline is losing all the more
    other = ClaimResult("x_vs_exact", "x beats pb_s_exact", REPRODUCED, entries=("x", "pb_s_exact"))
    assert apply_weak_baselines([other], weak) == ([other], [])
    # `against` names the baselines outright (a claim against the best of several baselines)
    said = ClaimResult("x_vs_best", "x beats the best baseline", REPRODUCED, entries=("x", "best"), against=("pb_s",))
    assert apply_weak_baselines([said], weak)[0][0].verdict == WEAK
    own = ClaimResult("x_vs_pb_s", "x beats pb_s", REPRODUCED, entries=("x", "pb_s"), against=())
    assert apply_weak_baselines([own], weak)[0][0].verdict == REPRODUCED


def test_headline_spec_defaults_and_errors():
    head = headline_spec(SPEC)
    assert head == {
        "start": "val/acc",
        "metric": "val/acc",
        "higher_is_better": True,
        "baselines": ["base", "base_exact"],
        "reference": None,
    }
    assert headline_spec({**SPEC, "headline": {"reference": 0.1}})["reference"] == {"value": 0.1}
    longer = {**SPEC, "runs": [*SPEC["runs"], {"name": "base_long"}, {"name": "solo_long"}]}  # a 4x check of base
    assert headline_spec(longer)["baselines"] == ["base", "base_exact", "solo_long"]
    for bad, match in [
        ({"baseline": ["base"]}, "unknown keys"),
        ({"baselines": ["nope"]}, "must list runs"),
        ({"reference": {"entry": "nope"}}, "not a run"),
        ({"reference": "chance"}, "must be a number"),
        ({"reference": {"value": 1, "entry": "base"}}, "must be a number"),
    ]:
        with pytest.raises(ConfigError, match=match):
            headline_spec({**SPEC, "headline": bad})


def test_write_page_lists_baselines_and_flips_a_declared_verdict(tmp_path):
    from suite.claim import write_page

    claim = {
        "id": "ours_vs_base",
        "text": "ours beats the baseline",
        "metric": "test/acc",
        "entries": ["ours", "base"],
        "higher_is_better": True,
    }
    spec = {**SPEC, "runs": SPEC["runs"][:2], "claims": [claim], "headline": {"start": "val/acc"}}
    del spec["sizing_metric"]  # no curves here: convergence is not what this test is about
    records = _runs("ours", 0.1, 0.9, 0.9) + _runs("base", 0.5, 0.3, 0.3)
    data = {}
    text = write_page("demo", spec, records, {}, tmp_path, [], tmp_path / "demo.md", data=data).read_text()
    assert "## Baselines: better than their start and than a trivial reference?" in text
    assert "| base | **yes** | ends no better than its start" in text
    assert f"| ours beats the baseline (`ours_vs_base`, exploratory) | **{WEAK}** |" in text
    assert "- **Weak baseline.** `ours_vs_base`: `base` ends no better than its start" in text
    assert data["claims"][0]["verdict"] == WEAK and "a weak baseline" in data["claims"][0]["why"]
    # a healthy baseline leaves the verdict as the interval reads it
    healthy = _runs("ours", 0.1, 0.9, 0.9) + _runs("base", 0.1, 0.5, 0.3)
    text = write_page("demo", spec, healthy, {}, tmp_path, [], tmp_path / "ok.md").read_text()
    assert "(`ours_vs_base`, exploratory) | **reproduced** |" in text and "Weak baseline.**" not in text


def test_claim_entries_record_their_start():
    from suite.claim import entry_command

    spec = {"runs": [{"name": "a"}], "seeds": [0]}
    assert "eval_at_start=true" in entry_command("x", spec["runs"][0], spec, Path("out"), [])
    off = entry_command("x", {"name": "a", "overrides": "eval_at_start=false"}, spec, Path("out"), [])
    assert "eval_at_start=false" in off and "eval_at_start=true" not in off


def test_preserved_rng_restores_every_generator():
    before = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    with preserved_rng():
        random.random(), np.random.rand(), torch.rand(3)
    assert random.getstate() == before[0]
    assert (np.random.get_state()[1] == before[1]).all()
    assert torch.equal(torch.get_rng_state(), before[2])


def test_a_real_run_logs_its_start(tmp_path):
    """SEMDICE's pb_s baseline (the fastest real experiment) over 10 trajectories: the untrained policy is uniform,
    so its normalised entropy at step 0 is 0 by definition."""
    from suite.run import train
    from tests.conftest import compose_train

    semdice = [
        "experiment=semdice",
        "logger=csv",
        "trainer.max_epochs=2",
        "data.trajectories_per_epoch=5",
        "callbacks.model_checkpoint=null",
        "model.kind=pb_s",
        "trainer.enable_progress_bar=false",
    ]
    metrics = train(compose_train([*semdice, "eval_at_start=true"], tmp_path))
    assert metrics["val/normalized_entropy@start"] == pytest.approx(0.0, abs=1e-9)
    assert metrics["val/normalized_entropy"] > 0.05  # it learnt something in 10 trajectories
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["val/normalized_entropy@start"] == pytest.approx(0.0, abs=1e-9)


def test_the_start_changes_no_training_and_a_fresh_run_drops_an_old_start(tmp_path):
    from suite.run import train
    from tests.conftest import FIXTURE_CONF, compose_train

    fixture = [FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", "trainer.max_epochs=2"]
    with_start = train(compose_train([*fixture, "eval_at_start=true"], tmp_path / "a"))
    without = train(compose_train(fixture, tmp_path / "b"))
    assert with_start["val/loss@start"] > 10 * with_start["val/loss"]  # the untrained linear model, then trained
    assert {k: v for k, v in with_start.items() if not k.endswith("@start")} == without
    assert (tmp_path / "a" / START_FILE).is_file()
    rerun = train(compose_train(fixture, tmp_path / "a"))  # a fresh run in the same folder, without the start
    assert not any(k.endswith("@start") for k in rerun) and not (tmp_path / "a" / START_FILE).exists()


def test_no_start_on_a_run_over_several_processes():
    from types import SimpleNamespace

    from suite.start_metrics import evaluate_at_start

    # before fit a DDP run launched by Lightning may still say world size 1: its device count decides
    ddp = SimpleNamespace(world_size=1, num_devices=2, num_nodes=1)
    assert evaluate_at_start(None, None, None, ddp) == {}  # returns before touching the config or the model


def test_semdice_deep_reads_apt_below_the_untrained_actor_as_a_weak_baseline(tmp_path):
    """SEMDICE's UMaze case: APT's actor ends below the untrained one (0.68 vs 1.50 nats), so "SEMDICE beats APT" reads
    inconclusive: weak baseline on the page, whatever its margin."""
    from suite.claim import judge_page, load_spec
    from suite.claims import ClaimSpec

    def run(name, seed, end, start=None):
        m = {
            "test/cell_entropy": end + 0.01 * seed * (seed + 1) * (2 if name == "semdice" else 1),
            "val/cell_entropy": end + 0.01 * seed,
        }
        if start is not None:
            m["val/cell_entropy@start"] = start
        curve = {"val/cell_entropy": [(i, end + 0.01 * seed) for i in range(10)]}
        return RunRecord(None, name, seed, m, curve, {"data": {"seed": seed}})

    spec = ClaimSpec.from_dict("semdice_deep", load_spec("semdice_deep"))
    records = [run("semdice", s, 3.0) for s in range(3)] + [run("init", s, 1.5) for s in range(3)]
    records += [run("apt", s, 0.68) for s in range(3)]  # old runs: no start recorded, the reference alone decides
    checks = baseline_checks(records, spec.raw)
    assert checks["apt"].weak is True and "no better than the untrained actor" in checks["apt"].reading
    verdicts, weak_notes, *_ = judge_page(spec, records, tmp_path)
    offline = {v.id: v for v in verdicts}["semdice_vs_apt_offline"]
    assert offline.verdict == WEAK and offline.lo > 0 and "`apt`, a weak baseline" in offline.why
    assert len(weak_notes) == 1 and weak_notes[0].startswith("`semdice_vs_apt_offline`: `apt`")
    # the online APT (its paper's protocol) that beats its start and the untrained actor leaves its verdict reproduced
    healthy = [*records, *(run("apt_online", s, 2.0, start=1.5) for s in range(3))]
    by_id = {v.id: v for v in judge_page(spec, healthy, tmp_path)[0]}
    assert by_id["semdice_vs_apt_online"].verdict == REPRODUCED and by_id["semdice_vs_apt_offline"].verdict == WEAK


def test_an_empty_baseline_list_says_the_rule_has_nothing_to_judge():
    records = _runs("ours", 0.1, 0.9, 0.9) + _runs("base", 0.5, 0.2, 0.2)  # base would be weak by default
    lines, weak = baseline_section(records, {**SPEC, "headline": {"baselines": []}})
    assert weak == {} and "rule has nothing to judge" in "\n".join(lines)
    _, weak = baseline_section(records, SPEC)
    assert set(weak) == {"base"}


CLAIM_DIR = Path(__file__).resolve().parents[2] / "conf" / "claim"
HEADLINED = sorted(p for p in CLAIM_DIR.rglob("*.yaml") if "\nheadline:" in p.read_text())  # with gpu/, paper/


def test_the_claims_declare_their_headlines():
    assert len(HEADLINED) >= 10, [p.name for p in HEADLINED]  # the glob finds the specs


@pytest.mark.parametrize("path", HEADLINED, ids=lambda p: str(p.relative_to(CLAIM_DIR)))
def test_every_declared_headline_parses_and_starts_from_a_validation_metric(path):
    from omegaconf import OmegaConf

    spec = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    head = headline_spec(spec)  # a malformed headline is a ConfigError
    assert head["start"] is None or str(head["start"]).startswith("val/"), (
        f"start={head['start']!r}: eval_at_start records only val/* keys (null: no start rule)"
    )
    assert str(head["metric"]).startswith(("val/", "test/")), head["metric"]
    assert not [b for b in head["baselines"] if b.endswith("_long")], "a 4x sizing check is not a baseline"


def test_a_null_start_judges_the_reference_only():
    records = _runs("ours", 0.1, 0.9, 0.9) + _runs("base", 0.5, 0.2, 0.8)  # ends below its start, above 0.5
    spec = {**SPEC, "headline": {"start": None, "metric": "test/acc", "reference": 0.5}}
    assert headline_spec(spec)["start"] is None
    checks = baseline_checks(records, spec)
    assert checks["base"].weak is False and "start not judged" in checks["base"].reading
    lines, _ = baseline_section(records, spec)
    assert "not judged here" in "\n".join(lines)
    checks = baseline_checks(records, {**spec, "headline": {"metric": "test/acc", "reference": 0.5}})
    assert checks["base"].weak is True  # the default start (sizing_metric val/acc) fell from 0.5 to 0.2
