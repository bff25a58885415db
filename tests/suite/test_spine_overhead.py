"""The spine's cheap per-step path (asynchronous loggers, a throttled bar) keeps what a user sees: the wandb history,
the CSV curve and the progress bar's final position are the same as with per-step synchronous work."""

from __future__ import annotations

import csv
import threading

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from suite.loggers import ResumableCSVLogger, make_wandb_logger
from suite.plumbing.progress import ThrottledRichProgressBar
from suite.run import train
from suite.wandb_reader import find_wandb_files, wait_for_wandb_run
from tests.conftest import FIXTURE_CONF, compose_train


def _csv_rows(path):
    if not path.is_file():
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.spine  # a whole run of the train entry point
def test_async_wandb_history_equals_the_csv_curve_step_by_step(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose_train([FIXTURE_CONF, "experiment=spine_fixture", "logger=wandb", "trainer.max_epochs=2"], tmp_path)
    train(cfg)
    run = wait_for_wandb_run(find_wandb_files(tmp_path)[0])
    rows = _csv_rows(tmp_path / "csv" / "metrics.csv")
    csv_steps = [(int(r["step"]), float(r["train/loss_step"])) for r in rows if r.get("train/loss_step")]
    wandb_steps = [(int(h["trainer/global_step"]), h["train/loss_step"]) for h in run.history if "train/loss_step" in h]
    assert len(csv_steps) >= 4
    assert [s for s, _ in wandb_steps] == [s for s, _ in csv_steps]  # every step, in order
    assert [v for _, v in wandb_steps] == pytest.approx([v for _, v in csv_steps], rel=1e-6)


def test_async_wandb_logs_off_the_training_thread_in_order_and_never_raises(tmp_path, monkeypatch):
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = make_wandb_logger(str(tmp_path), project="p", mode="offline")
    seen: list[tuple[str, int]] = []

    release = threading.Event()

    def blocked_log(self, metrics, step=None):
        release.wait(timeout=10)  # wandb's log call does not return until the test lets it (or 10 s pass)
        if step == 2:
            raise RuntimeError("simulated wandb hiccup")
        seen.append((threading.current_thread().name, step))

    monkeypatch.setattr(WandbLogger, "log_metrics", blocked_log)
    with pytest.warns(UserWarning, match="wandb logging failed .*simulated wandb hiccup"):
        for step in range(5):
            logger.log_metrics({"x": float(step)}, step=step)
        assert seen == []  # every call returned while no row could be logged: the training thread only queued them
        release.set()
        logger.experiment  # any other use of the run waits for the queue first  # noqa: B018
    assert seen == [("wandb-log", s) for s in (0, 1, 3, 4)]  # in order; the failed row is skipped, not fatal
    logger.experiment.finish()


def test_csv_rows_are_written_at_checkpoints_and_at_the_end_not_every_step(tmp_path):
    logger = ResumableCSVLogger(save_dir=str(tmp_path), name="csv", version="")
    path = tmp_path / "csv" / "metrics.csv"
    for step in range(5):
        logger.log_metrics({"train/loss": float(step)}, step=step)
        logger.save()  # what Lightning's logger connector calls after every logged step
    assert len(_csv_rows(path)) == 0  # buffered
    logger.after_save_checkpoint(None)  # a checkpoint: the file covers every step it holds
    assert [float(r["train/loss"]) for r in _csv_rows(path)] == [0, 1, 2, 3, 4]
    for step in range(5, 7):
        logger.log_metrics({"train/loss": float(step)}, step=step)
        logger.save()
    logger.finalize("failed")  # end of fit / test, or a failure (SIGTERM included)
    assert [float(r["train/loss"]) for r in _csv_rows(path)] == [0, 1, 2, 3, 4, 5, 6]
    every = ResumableCSVLogger(save_dir=str(tmp_path / "b"), name="csv", version="", flush_logs_every_n_steps=3)
    for step in range(4):
        every.log_metrics({"train/loss": float(step)}, step=step)
        every.save()
    assert len(_csv_rows(tmp_path / "b" / "csv" / "metrics.csv")) == 3


class _Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        loss = self.lin(batch[0]).pow(2).mean()
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize("max_steps", [-1, 37])  # the whole epoch; stopped mid-epoch by max_steps
def test_throttled_bar_draws_rarely_and_ends_where_training_stopped(tmp_path, monkeypatch, max_steps):
    bar = ThrottledRichProgressBar(refresh_rate=1)
    drawn: list[int] = []
    update = ThrottledRichProgressBar._update

    def record(self, bar_id, current, *args, **kwargs):
        if bar_id is not None and bar_id == self.train_progress_bar_id:
            drawn.append(current)
        return update(self, bar_id, current, *args, **kwargs)

    monkeypatch.setattr(ThrottledRichProgressBar, "_update", record)
    data = DataLoader(TensorDataset(torch.randn(50, 4)), batch_size=1)
    trainer = pl.Trainer(
        max_epochs=1,
        max_steps=max_steps,
        callbacks=[bar],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(_Tiny(), train_dataloaders=data)
    assert len(drawn) <= 5  # 50 fast batches at one draw a second: the first, the last, and few between
    assert drawn[-1] == (50 if max_steps == -1 else 37)
