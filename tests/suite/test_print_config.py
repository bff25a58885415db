"""The composed config is printed as a tree when a run starts (``print_config: true``, the default outside the
tests), once per run: a DDP run's other rank prints nothing."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from lightning.fabric.utilities.rank_zero import rank_zero_only

from suite.config_tree import config_tree, print_config_tree
from tests.conftest import FIXTURE_CONF, ROOT, compose_train, run_cli

FIXTURE = [FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", "trainer.max_epochs=1"]
BRANCHES = ["data", "model", "callbacks", "logger", "trainer", "paths"]


def _printed(cfg) -> str:
    out = io.StringIO()
    assert print_config_tree(cfg, file=out)
    return out.getvalue()


def _branches(text: str) -> list[str]:
    return [line[4:].strip() for line in text.splitlines() if line.startswith(("├── ", "└── "))]


def test_the_tree_has_a_branch_per_group_in_order_with_resolved_values(tmp_path):
    text = _printed(compose_train([*FIXTURE, "seed=7"], tmp_path))
    assert text.splitlines()[0] == "config"
    branches = _branches(text)
    assert branches[: len(BRANCHES)] == BRANCHES and branches[-1] == "run"
    assert f"dirpath: {tmp_path}/checkpoints" in text  # ${paths.output_dir}/checkpoints, resolved
    assert "seed: 7" in text.split("└── run", 1)[1]  # top-level values under `run`
    assert "_target_: tests.fixtures.tiny.TinyLitModule" in text.split("── model", 1)[1].split("── callbacks")[0]


def test_long_lines_are_not_cut_at_80_columns(tmp_path):
    deep = tmp_path / ("x" * 120)
    text = _printed(compose_train(FIXTURE, deep))
    assert f"dirpath: {deep}/checkpoints" in text


def test_an_unresolvable_value_is_shown_as_written(tmp_path):
    cfg = compose_train([*FIXTURE, "+model.extra=${oc.env:SUITE_TEST_NO_SUCH_VARIABLE}"], tmp_path)
    model = config_tree(cfg).children[1]
    assert str(model.label) == "model"
    assert "extra: ${oc.env:SUITE_TEST_NO_SUCH_VARIABLE}" in model.children[0].label.code


def test_a_process_of_another_rank_prints_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    out = io.StringIO()
    assert not print_config_tree(compose_train(FIXTURE, tmp_path), file=out)
    assert out.getvalue() == ""


def _train(tmp_path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    args = [*FIXTURE, f"hydra.run.dir={tmp_path / 'run'}", *extra]
    return subprocess.run(
        [sys.executable, "-m", "train", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def test_a_run_prints_the_tree_once_before_training_by_default_and_not_when_off(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("SUITE_PRINT_CONFIG", "HYDRA_FULL_ERROR")}
    env.update(PYTHONPATH=str(ROOT), WANDB_MODE="offline")
    proc = _train(tmp_path / "on", env=env)  # as a user runs it: no SUITE_PRINT_CONFIG
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.count("\nconfig\n") + out.startswith("config\n") == 1 and _branches(out)[:2] == ["data", "model"]
    assert out.index("── trainer") < out.index("run finished:")
    off = _train(tmp_path / "off", "print_config=false", env=env)
    assert off.returncode == 0 and "── trainer" not in off.stdout and "run finished:" in off.stdout


@pytest.mark.slow
def test_a_ddp_run_prints_the_tree_once(tmp_path):
    proc = run_cli(["train", *FIXTURE, "trainer=ddp_cpu", "print_config=true", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "devices.json").read_text())[0]["world_size"] == 2  # two ranks ran
    assert proc.stdout.count("── callbacks") == 1, proc.stdout[-3000:]
