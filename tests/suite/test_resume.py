"""A run stopped by SIGTERM mid-epoch and resumed with ckpt_path=last ends exactly like an uninterrupted run."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import FIXTURE_CONF, run_cli

COMMON = [FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", "trainer.max_epochs=3"]


@pytest.mark.slow
def test_sigterm_mid_epoch_then_resume_matches_uninterrupted(tmp_path):
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    full = run_cli(["train", *COMMON, f"hydra.run.dir={full_dir}"])
    assert full.returncode == 0, full.stderr[-3000:]

    # 8 batches per epoch: step 13 is batch 5 of epoch 1, i.e. mid-epoch.
    cut = run_cli(
        ["train", *COMMON, f"hydra.run.dir={cut_dir}",
         "+callbacks.kill._target_=tests.fixtures.tiny.SigtermAtStep", "+callbacks.kill.step=13"]
    )  # fmt: skip
    assert cut.returncode != 0 or not (cut_dir / "metrics.json").exists()
    state = torch.load(cut_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["global_step"] == 13 and state["epoch"] == 1

    resumed = run_cli(["train", *COMMON, f"hydra.run.dir={cut_dir}", "ckpt_path=last"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = json.loads((full_dir / "metrics.json").read_text())
    b = json.loads((cut_dir / "metrics.json").read_text())
    for key in ("val/loss", "test/mse", "test/r2"):
        assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), key
    final = torch.load(cut_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert final["global_step"] == 24


def test_last_never_picks_another_configurations_checkpoint(tmp_path):
    from suite.run import resolve_checkpoint

    for name, overrides in (("a", ["experiment=x", "model.lr=1"]), ("b", ["experiment=x", "model.lr=2"])):
        run = tmp_path / "runs" / name
        (run / "checkpoints").mkdir(parents=True)
        (run / "checkpoints" / "last.ckpt").write_bytes(b"x")
        (run / ".hydra").mkdir()
        (run / ".hydra" / "overrides.yaml").write_text("\n".join(f"- {o}" for o in overrides))
    new = tmp_path / "runs" / "new"
    found = resolve_checkpoint("last", new, tmp_path, ["experiment=x", "model.lr=1", "ckpt_path=last"])
    assert found == str(tmp_path / "runs" / "a" / "checkpoints" / "last.ckpt")
    assert resolve_checkpoint("last", new, tmp_path, ["experiment=x", "model.lr=3", "ckpt_path=last"]) is None
