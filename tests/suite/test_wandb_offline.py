"""wandb runs offline with no network, and what it logged reads back from its files (cross-checked with CSV)."""

from __future__ import annotations

import csv

import pytest

from suite.run import train
from suite.wandb_reader import find_wandb_files, wait_for_wandb_run
from tests.conftest import FIXTURE_CONF, compose_train


def test_wandb_offline_files_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose_train([FIXTURE_CONF, "experiment=spine_fixture", "logger=wandb", "trainer.max_epochs=2"], tmp_path)
    metrics = train(cfg)
    files = find_wandb_files(tmp_path)
    assert len(files) == 1
    run = wait_for_wandb_run(files[0])
    assert run.complete
    logged = [row["val/loss"] for row in run.history if "val/loss" in row]
    assert len(logged) == 2  # one validation per epoch
    assert run.summary["test/mse"] == pytest.approx(metrics["test/mse"], rel=1e-6)
    assert run.config["seed"] == 0 and run.config["experiment_slug"] == "spine_fixture"
    with open(tmp_path / "csv" / "metrics.csv") as fh:
        csv_val = [float(r["val/loss"]) for r in csv.DictReader(fh) if r.get("val/loss")]
    assert logged == pytest.approx(csv_val, rel=1e-6)
    # The service writes the file while the run ends: every prefix of it (a record cut mid-way, a block cut at its
    # trailer) reads back as the records written so far, never a parse error.
    from suite.wandb_reader import read_wandb_run

    data = files[0].read_bytes()
    cut = tmp_path / "cut.wandb"
    sizes = []
    for end in sorted({*range(7, len(data), max(1, len(data) // 97)), len(data) - 1, len(data) - 3}):
        cut.write_bytes(data[:end])
        sizes.append(len(read_wandb_run(cut).history))
    assert sizes == sorted(sizes) and sizes[-1] <= len(run.history)


def test_wandb_failure_never_fails_the_run(tmp_path, monkeypatch):
    import lightning.pytorch.loggers as loggers

    from suite.loggers import make_wandb_logger

    def broken(*args, **kwargs):
        raise RuntimeError("simulated wandb outage")

    monkeypatch.setattr(loggers.WandbLogger, "__init__", broken)
    with pytest.warns(UserWarning, match="wandb disabled for this run .*simulated wandb outage"):
        assert make_wandb_logger(str(tmp_path), project="p", mode="online") is None


def test_wandb_mode_resolution(monkeypatch, tmp_path):
    from suite.loggers import wandb_mode

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "absent"))
    assert wandb_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert wandb_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_mode("auto") == "offline"


def test_compare_reads_a_wandb_only_run(tmp_path, monkeypatch):
    import shutil

    from suite.compare import read_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose_train([FIXTURE_CONF, "experiment=spine_fixture", "logger=wandb", "trainer.max_epochs=1"], tmp_path)
    metrics = train(cfg)
    shutil.rmtree(tmp_path / "csv")
    (tmp_path / "metrics.json").unlink()
    rec = read_run(tmp_path)
    assert rec.metrics["test/mse"] == pytest.approx(metrics["test/mse"], rel=1e-6)
    assert len(rec.curves["val/loss"]) == 1


def test_tensorboard_logger_is_a_dashboard_without_an_account(tmp_path):
    """`logger=tensorboard`: CSV plus TensorBoard event files that TensorBoard's own reader reads back (the values
    `tensorboard --logdir logs/train` shows), with no wandb run made."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = compose_train(
        [FIXTURE_CONF, "experiment=spine_fixture", "logger=tensorboard", "trainer.max_epochs=2"], tmp_path
    )
    train(cfg)
    assert not find_wandb_files(tmp_path)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    logged = [e.value for e in events.Scalars("val/loss")]
    with open(tmp_path / "csv" / "metrics.csv") as fh:
        csv_val = [float(r["val/loss"]) for r in csv.DictReader(fh) if r.get("val/loss")]
    assert len(logged) == 2 and logged == pytest.approx(csv_val, rel=1e-6)
