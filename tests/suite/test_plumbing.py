"""The runner's own callbacks (``suite/plumbing/``): smoke mode as a callback that ``core.smoke`` reads, and a config
saved before the runner's callbacks moved out of ``callbacks/`` (its ``.hydra/config.yaml`` naming
``callbacks.preemption.CheckpointOnSigterm``) still builds and resumes."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf, open_dict

from core.checkpoint import load_checkpoint
from core.smoke import smoke_test
from suite.build import build
from suite.plumbing import MOVED_MODULES, MOVED_TARGETS, moved_target, update_moved_targets
from suite.plumbing.preemption import CheckpointOnSigterm
from suite.plumbing.run_config import CONFIG_KEY, ConfigInCheckpoint
from suite.plumbing.smoke import SmokeMode
from suite.run import train
from tests.conftest import FIXTURE_CONF, compose_train, run_entry

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


def test_moved_targets_are_mapped_at_any_depth():
    node = OmegaConf.create(
        {
            "_target_": "lightning_modules.causal_lm.CausalLMLitModule",
            "net": {"_target_": "layers.lm.CausalLM", "mixer": [{"_target_": "lightning_modules.diffusion.f"}]},
            "sampler": "${net}",  # an interpolation is left as it is
        }
    )
    update_moved_targets(node)
    assert node._target_ == "lightning_modules._shared.causal_lm.CausalLMLitModule"
    assert node.net._target_ == "layers.lm.CausalLM"  # not moved
    assert node.net.mixer[0]._target_ == "lightning_modules._shared.diffusion.f"
    assert OmegaConf.is_interpolation(node, "sampler")
    assert moved_target("lightning_modules.minilm_mlm.X") == "lightning_modules.ostquant.minilm_mlm.X"
    assert moved_target("lightning_modules.causal_lm_extra.X") == "lightning_modules.causal_lm_extra.X"


@pytest.mark.parametrize(
    ("slug", "old"),
    [
        ("stickbreaking", "lightning_modules.causal_lm.CausalLMLitModule"),
        ("sgm_lipschitz", "lightning_modules.diffusion.DiffusionLitModule"),
        ("grass", "lightning_modules.grass.GrassLitModule"),  # a file that became a folder keeps its path
    ],
)
def test_a_model_saved_under_its_former_target_builds(tmp_path, slug, old):
    cfg = compose_train([f"experiment={slug}", "logger=none", "trainer.enable_progress_bar=false"], tmp_path)
    new = cfg.model._target_
    with open_dict(cfg):
        cfg.model._target_ = old  # as a run folder's .hydra/config.yaml saved before the move names it
    objs = build(cfg)
    assert type(objs["model"]).__name__ == new.rsplit(".", 1)[1]
    assert f"_target_: {moved_target(old)}\n" in objs["config_yaml"]  # the checkpoint names the current place
    assert old == new or f"_target_: {old}\n" not in objs["config_yaml"]


def test_a_checkpoint_saved_under_a_former_model_target_evaluates(tmp_path, monkeypatch):
    train(compose_train([*FIXTURE, "trainer.max_epochs=1"], tmp_path / "run"))
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert "_target_: tests.fixtures.tiny.TinyLitModule" in state[CONFIG_KEY]
    state[CONFIG_KEY] = state[CONFIG_KEY].replace("tests.fixtures.tiny.", "tests.fixtures.tiny_before_the_move.")
    torch.save(state, ckpt)
    monkeypatch.setitem(MOVED_MODULES, "tests.fixtures.tiny_before_the_move", "tests.fixtures.tiny")
    assert run_entry("evaluate", [f"ckpt_path={ckpt}", f"hydra.run.dir={tmp_path / 'eval'}", *FIXTURE[:1]]) == 0
    assert "test/mse" in json.loads((tmp_path / "eval" / "metrics.json").read_text())
    monkeypatch.delitem(MOVED_MODULES, "tests.fixtures.tiny_before_the_move")
    assert run_entry("evaluate", [f"ckpt_path={ckpt}", f"hydra.run.dir={tmp_path / 'eval2'}", *FIXTURE[:1]]) != 0
