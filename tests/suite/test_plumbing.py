"""The runner's own callbacks (``suite/plumbing/``): smoke mode as a callback that ``core.smoke`` reads, and a config
saved before the runner's callbacks moved out of ``callbacks/`` (its ``.hydra/config.yaml`` naming
``callbacks.preemption.CheckpointOnSigterm``) still builds and resumes."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from omegaconf import open_dict

from core.checkpoint import load_checkpoint
from core.smoke import smoke_test
from suite.build import build
from suite.plumbing import MOVED_TARGETS
from suite.plumbing.preemption import CheckpointOnSigterm
from suite.plumbing.run_config import CONFIG_KEY, ConfigInCheckpoint
from suite.plumbing.smoke import SmokeMode
from suite.run import train
from tests.conftest import FIXTURE_CONF, compose_train

FIXTURE = [FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", "trainer.enable_progress_bar=false"]


def test_smoke_test_reads_fast_dev_run_or_the_smoke_callback():
    assert smoke_test(SimpleNamespace(fast_dev_run=1, callbacks=[]))
    assert smoke_test(SimpleNamespace(fast_dev_run=False, callbacks=[object(), SmokeMode()]))
    assert not smoke_test(SimpleNamespace(fast_dev_run=False, callbacks=[object()]))
    assert not smoke_test(None)  # a module outside a trainer


def test_a_debug_config_builds_a_smoke_trainer(tmp_path):
    debug = build(compose_train([*FIXTURE, "smoke=true"], tmp_path / "a"))["trainer"]
    plain = build(compose_train(FIXTURE, tmp_path / "b"))["trainer"]
    assert smoke_test(debug) and not smoke_test(plain)
    assert not hasattr(debug, "suite_smoke")  # no attribute patched onto Lightning's Trainer


def _old_targets(cfg):
    """``cfg`` as a run folder saved before the move names its callbacks."""
    old = {new: former for former, new in MOVED_TARGETS.items()}
    with open_dict(cfg):
        for node in cfg.callbacks.values():
            if node is not None and node.get("_target_") in old:
                node._target_ = old[node._target_]
    return cfg


def test_callbacks_saved_under_their_former_targets_build(tmp_path):
    cfg = _old_targets(compose_train(FIXTURE, tmp_path))
    assert cfg.callbacks.preemption._target_ == "callbacks.preemption.CheckpointOnSigterm"
    callbacks = build(cfg)["trainer"].callbacks
    assert any(isinstance(cb, CheckpointOnSigterm) for cb in callbacks)
    (config,) = [cb for cb in callbacks if isinstance(cb, ConfigInCheckpoint)]
    assert "suite.plumbing.preemption.CheckpointOnSigterm" in config.config_yaml  # the checkpoint names the new one


def test_a_run_saved_under_the_former_targets_resumes(tmp_path, caplog):
    train(_old_targets(compose_train([*FIXTURE, "trainer.max_epochs=1"], tmp_path)))
    first = load_checkpoint(str(tmp_path / "checkpoints" / "last.ckpt"))["global_step"]
    caplog.set_level(logging.INFO, logger="suite.run")
    train(_old_targets(compose_train([*FIXTURE, "trainer.max_epochs=2", "ckpt_path=last"], tmp_path)))
    assert f"(global step {first})" in caplog.text  # resumed from its own last.ckpt, not started afresh
    state = load_checkpoint(str(tmp_path / "checkpoints" / "last.ckpt"))
    assert state["global_step"] == 2 * first > 0
    assert "suite.plumbing.run_config.ConfigInCheckpoint" in state[CONFIG_KEY]
