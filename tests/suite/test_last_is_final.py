"""``last.ckpt`` is the state training ended in, whatever the validation interval, so ``make eval`` on a run's
``last.ckpt`` reproduces the test metrics the run reported (they come from weights that are on disk)."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from callbacks.checkpoint import FinalStateCheckpoint
from tests.conftest import ROOT, compose_train, run_entry

SLUGS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("slug", SLUGS)
def test_every_experiment_keeps_the_final_state_checkpoint(slug, tmp_path):
    """No experiment swaps the checkpoint callback for one whose ``last.ckpt`` can lag the final step."""
    cfg = compose_train([f"experiment={slug}"], tmp_path)
    assert cfg.callbacks.model_checkpoint._target_ == "callbacks.checkpoint.FinalStateCheckpoint", slug
    assert cfg.callbacks.model_checkpoint.save_last is True, slug


def test_the_callback_restores_model_checkpoint_state():
    """Same state key as Lightning's class: older checkpoints resume into it, ``make eval`` recognises its state."""
    assert FinalStateCheckpoint(dirpath="x").state_key == ModelCheckpoint(dirpath="x").state_key


@pytest.mark.slow
def test_make_eval_on_last_ckpt_reproduces_a_run_validated_off_its_last_step(tmp_path, capsys):
    """systematic_outliers validates every 200 of its 440 steps; here every 5 of 13: Lightning's own ``last.ckpt``
    holds step 10 while the run tests (and censuses) the step-13 weights."""
    logs = tmp_path / "logs"
    shrink = [
        "trainer.limit_train_batches=13",
        "trainer.val_check_interval=5",
        "trainer.limit_val_batches=2",
        "trainer.limit_test_batches=2",
        "logger=csv",
        "trainer.enable_progress_bar=false",
    ]
    assert run_entry("train", ["experiment=systematic_outliers", *shrink, f"paths.log_dir={logs}"]) == 0
    capsys.readouterr()
    (run,) = (logs / "train" / "systematic_outliers" / "runs").iterdir()
    last = run / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 13
    trained = json.loads((run / "metrics.json").read_text())

    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    ev = subprocess.run(
        [
            "make",
            "-s",
            "--no-print-directory",
            "eval",
            f"CKPT={last}",
            f"ARGS=paths.log_dir={logs} trainer.limit_test_batches=2 trainer.enable_progress_bar=false",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert ev.returncode == 0, ev.stderr[-3000:]
    (eval_run,) = (logs / "eval" / "systematic_outliers" / "runs").iterdir()
    evaluated = json.loads((eval_run / "metrics.json").read_text())
    keys = sorted(k for k in trained if k.startswith("test/"))
    assert keys and keys == sorted(evaluated), (keys, sorted(evaluated))
    for key in keys:
        assert evaluated[key] == pytest.approx(trained[key], rel=1e-6), key
    # the checkpoint callback's state key is Lightning's own (a training callback such as the outlier census, whose
    # state the checkpoint also holds, is not needed to evaluate and may be named)
    missing = re.findall(r"Please add the following callbacks: \[(.*?)\]", ev.stdout + ev.stderr)
    assert not any("Checkpoint" in m for m in missing), missing
