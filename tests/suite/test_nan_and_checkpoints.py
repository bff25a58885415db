"""A NaN loss stops the run naming the step and keeps the last good checkpoint; checkpoints load weights-only."""

from __future__ import annotations

import math

import pytest
import torch

from core.checkpoint import load_checkpoint
from core.errors import CheckpointError, NonFiniteLossError
from suite.plumbing.run_config import CONFIG_KEY
from suite.run import train
from tests.conftest import FIXTURE_CONF, compose_train, run_cli, run_entry


def test_nan_loss_stops_with_step_and_keeps_last_good_checkpoint(tmp_path):
    # 8 steps per epoch: the end of epoch 0 writes last.ckpt at step 8; the loss turns NaN at global step 11
    # (epoch 1, batch 3), and the message names that step, not the one after the optimizer increment.
    cfg = compose_train(
        [FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", "trainer.max_epochs=3", "model.nan_at_step=11"],
        tmp_path,
    )
    with pytest.raises(NonFiniteLossError, match=r"training loss became nan at global step 11 \(epoch 1, batch 3\)"):
        train(cfg)
    state = load_checkpoint(str(tmp_path / "checkpoints" / "last.ckpt"))
    assert state["global_step"] == 8
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values())


def test_nan_loss_cli_message(tmp_path):
    proc = run_cli(
        [
            "train",
            FIXTURE_CONF,
            "experiment=spine_fixture",
            "logger=csv",
            "model.nan_at_step=2",
            f"hydra.run.dir={tmp_path}",
        ]
    )
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: training loss became nan at global step 2 (epoch 0, batch 2)"]


def test_checkpoint_is_weights_only_and_carries_config(tmp_path):
    cfg = compose_train([FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", "trainer.max_epochs=1"], tmp_path)
    metrics = train(cfg)
    path = tmp_path / "checkpoints" / "last.ckpt"
    state = torch.load(path, weights_only=True)  # raises if anything needs unpickling of code
    assert "experiment_slug: spine_fixture" in state[CONFIG_KEY]
    assert math.isfinite(metrics["test/mse"])


def test_truncated_checkpoint_is_a_clear_error(tmp_path):
    cfg = compose_train([FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", "trainer.max_epochs=1"], tmp_path)
    train(cfg)
    good = tmp_path / "checkpoints" / "last.ckpt"
    bad = tmp_path / "truncated.ckpt"
    bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"truncated\.ckpt is truncated, corrupt or not weights-only loadable"):
        load_checkpoint(str(bad))


def test_pickled_code_in_checkpoint_is_refused(tmp_path):
    evil = tmp_path / "evil.ckpt"
    torch.save({"state_dict": {}, "payload": _Evil()}, evil)
    with pytest.raises(CheckpointError, match="not weights-only loadable"):
        load_checkpoint(str(evil))


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_evaluate_rebuilds_model_from_checkpoint(tmp_path):
    cfg = compose_train([FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", "trainer.max_epochs=1"], tmp_path)
    metrics = train(cfg)
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    # through the evaluate entry point in this process (`make eval CKPT=` as typed: test_user_commands.py)
    assert (
        run_entry("evaluate", [FIXTURE_CONF, f"ckpt_path={ckpt}", f"hydra.run.dir={tmp_path / 'eval'}", "logger=csv"])
        == 0
    )
    import json

    evaluated = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert evaluated["test/mse"] == pytest.approx(metrics["test/mse"], rel=1e-6)


def test_evaluate_truncated_checkpoint_one_line(tmp_path):
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"PK\x03\x04 not really a checkpoint")
    proc = run_cli(["evaluate", f"ckpt_path={bad}", f"hydra.run.dir={tmp_path / 'eval'}"])
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "bad.ckpt is truncated, corrupt or not weights-only loadable" in errors[0]
