"""Epoch checkpoints are named by the epoch and, when the checkpoint callback monitors a metric, that metric and its
value (``epoch_002-val_loss_0.0123.ckpt``) beside ``last.ckpt``; ``make eval CKPT=<that file>`` takes the name as
typed, and an explicit ``filename`` (the tta_arch claim's ``best``) is kept."""

from __future__ import annotations

import csv
import os
import re

import pytest

from callbacks.checkpoint import FinalStateCheckpoint, epoch_filename
from core.checkpoint import load_checkpoint
from suite.run import train
from tests._helpers.make import run_make
from tests.conftest import FIXTURE_CONF, ROOT, compose_train

BASE = [FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", "trainer.max_epochs=3"]


def test_the_template_names_the_epoch_and_the_monitored_metric():
    assert epoch_filename(None) == "epoch_{epoch:03d}"
    assert epoch_filename("val/r2") == "epoch_{epoch:03d}-val_r2_{val/r2:.4f}"
    assert epoch_filename("val/acc@start") == "epoch_{epoch:03d}-val_acc_start_{val/acc@start:.4f}"
    named = FinalStateCheckpoint(filename="best", monitor="val/loss")
    assert named.filename == "best"  # a filename given is used as it is
    assert FinalStateCheckpoint(monitor="val/mae").filename == "epoch_{epoch:03d}-val_mae_{val/mae:.4f}"


def _val_losses(run) -> list[float]:
    with open(run / "csv" / "metrics.csv") as f:
        return [float(r["val/loss"]) for r in csv.DictReader(f) if r.get("val/loss")]


def test_a_monitored_run_names_its_best_checkpoint_and_make_eval_reads_it(tmp_path):
    run = tmp_path / "run"
    monitor = ["callbacks.model_checkpoint.monitor=val/loss", "callbacks.model_checkpoint.mode=min"]
    train(compose_train([*BASE, *monitor], run))
    losses = _val_losses(run)
    best_epoch = min(range(len(losses)), key=losses.__getitem__)
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == [f"epoch_{best_epoch:03d}-val_loss_{losses[best_epoch]:.4f}.ckpt", "last.ckpt"], names
    best = run / "checkpoints" / names[0]
    assert load_checkpoint(str(best))["epoch"] == best_epoch

    # `make eval CKPT=<file>` as a user types it (the name has no '=' for Hydra's override parser to refuse)
    ckpt = os.path.relpath(best, ROOT)
    proc = run_make("eval", f"CKPT={ckpt}", f"ARGS={FIXTURE_CONF} paths.log_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(rf"evaluation of .*{re.escape(names[0])}", proc.stdout), proc.stdout[-2000:]


@pytest.mark.parametrize("extra", [[], ["callbacks.model_checkpoint.filename=best"]])
def test_without_a_monitor_the_newest_epoch_or_the_given_name(tmp_path, extra):
    train(compose_train([*BASE, *extra], tmp_path))
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == (["best.ckpt"] if extra else ["epoch_002.ckpt"]) + ["last.ckpt"]
