"""What a wandb run carries, read back from its offline files with the suite's reader (wandb's own protobufs, no
mock): a name and tags from what differs, the plots the run drew, ``metrics.json``, the config once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import lightning.pytorch as pl
import pytest

from core.errors import Preempted
from suite.compare import find_runs
from suite.loggers import NAME_OVERRIDES_MAX, run_name, run_tags
from suite.run import train
from suite.wandb_reader import find_wandb_files, wait_for_wandb_run
from tests.conftest import FIXTURE_CONF, compose_train, run_cli
from tests.fixtures.tiny import TinyLitModule


class TinyWithHparams(TinyLitModule):
    """The fixture model saving its init arguments as a paper's module does, so Lightning logs them at fit start."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters(ignore=["optimizer"])


class PlotAtStart(pl.Callback):
    """Draw ``plots/weights.png`` into the run folder as training starts (a run's own plot, before any SIGTERM)."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        out = Path(trainer.default_root_dir) / "plots"
        out.mkdir(parents=True, exist_ok=True)
        fig, ax = plt.subplots(figsize=(2, 2))
        ax.plot([0, 1, 4])
        fig.savefig(out / "weights.png", dpi=40)
        plt.close(fig)


PLOT = ["+callbacks.plot._target_=tests.suite.test_wandb_results.PlotAtStart"]
HPARAMS = "model._target_=tests.suite.test_wandb_results.TinyWithHparams"


def test_run_names_come_from_the_overrides_that_change_the_run():
    plumbing = ["experiment=leaderbot", "seed=1", "logger=wandb", "hydra.run.dir=x", "tags=[a]", "paths.log_dir=y"]
    assert run_name("leaderbot", 1, plumbing) == "leaderbot-s1"
    a = run_name("leaderbot", 0, [*plumbing, "model.lr=1e-3"])
    b = run_name("leaderbot", 0, [*plumbing, "model.lr=1e-4"])
    assert (a, b) == ("leaderbot-lr=1e-3-s0", "leaderbot-lr=1e-4-s0")
    # two keys with the same last part keep their full keys; lists and `~key` are written file-name safe
    both = run_name("x", 0, ["model.lr=1", "data.lr=2", "+model.dims=[4, 8]", "~model.net"])
    assert both == "x-model.lr=1-data.lr=2-dims=4+8-no-net-s0"
    long_a = run_name("x", 0, [f"model.key{i}=value{i}" for i in range(12)])
    long_b = run_name("x", 0, [f"model.key{i}=value{i}" for i in range(11)] + ["model.key11=other"])
    assert long_a != long_b and len(long_a) <= len("x--s0") + NAME_OVERRIDES_MAX
    for name in (a, both, long_a, run_name("x", 0, ["model.net={_target_: a.B, p: 'q r'}", "data.path=/a/b"])):
        assert re.fullmatch(r"[A-Za-z0-9._=+-]+", name), name


def test_run_tags_hold_experiment_overrides_and_the_users_tags():
    tags = run_tags("ostquant_minilm", ["ostquant", "minilm"], ["seed=0", "model.lr=0.1", "logger=csv"], ["mine"])
    assert tags == ["ostquant_minilm", "ostquant", "minilm", "model.lr=0.1", "mine"]
    assert run_tags("a", [], [], "one") == ["a", "one"]  # tags=one: a single tag
    assert all(len(t) <= 64 for t in run_tags("a", [], [f"model.x={'v' * 100}"], []))


def test_a_sweep_logs_each_job_with_its_name_tags_plots_metrics_and_config_once(tmp_path):
    """`python -m train -m model.optimizer.lr=0.05,0.01 tags=[mine]` as typed: two wandb runs with different names,
    each holding its plot as an image, its metrics.json as a file, and the config once."""
    sweep = tmp_path / "sweep"
    args = [
        "train",
        "-m",
        FIXTURE_CONF,
        "experiment=spine_fixture",
        "logger=wandb",
        "trainer.max_epochs=1",
        "model.optimizer.lr=0.05,0.01",
        "tags=[mine]",
        f"hydra.sweep.dir={sweep}",
        *PLOT,
        HPARAMS,
    ]
    proc = run_cli(args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = set()
    for job, lr in ((0, "0.05"), (1, "0.01")):
        folder = sweep / str(job)
        (file,) = find_wandb_files(folder)
        run = wait_for_wandb_run(file)
        assert run.complete
        job_overrides = [f"model.optimizer.lr={lr}" if a.startswith("model.optimizer.lr=") else a for a in args[2:]]
        assert run.name == run_name("spine_fixture", 0, job_overrides)
        assert run.name.startswith("spine_fixture-max_epochs=1-") and f"-lr={lr}-" in run.name
        names.add(run.name)
        assert run.tags[0] == "spine_fixture" and run.tags[-1] == "mine"
        assert {"trainer.max_epochs=1", f"model.optimizer.lr={lr}"} <= set(run.tags)
        assert run.group == "spine_fixture"
        # the run folder names the run and its tags too
        saved = (folder / "config.yaml").read_text()
        assert f"run_name: {run.name}\n" in saved and "- mine\n" in saved
        # the plot the run drew, as an image whose file is in the offline run
        (image,) = run.media("plots/plots/weights")
        assert image["_type"] == "image-file"
        assert (run.files_dir / image["path"]).read_bytes() == (folder / "plots" / "weights.png").read_bytes()
        # metrics.json as a file, with the run's own numbers
        assert "metrics.json" in run.files
        assert json.loads((run.files_dir / "metrics.json").read_text()) == json.loads(
            (folder / "metrics.json").read_text()
        )
        # the config once: the model under `model`, not also its init arguments at the top level
        assert run.config["model"]["optimizer"]["lr"] == float(lr)
        assert "nan_at_step" not in run.config and "dim" not in run.config
    assert len(names) == 2
    assert find_runs([sweep]) == [sweep / "0", sweep / "1"]  # the copy of metrics.json in a wandb run is no run


def test_an_interrupted_run_logs_the_plots_it_drew(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose_train(
        [
            FIXTURE_CONF,
            "experiment=spine_fixture",
            "logger=wandb",
            *PLOT,
            HPARAMS,
            "+callbacks.kill._target_=tests.fixtures.tiny.SigtermAtStep",
            "+callbacks.kill.step=3",
        ],
        tmp_path,
    )
    with pytest.raises(Preempted):
        train(cfg)
    (file,) = find_wandb_files(tmp_path)
    run = wait_for_wandb_run(file)
    assert run.complete
    assert len(run.media("plots/plots/weights")) == 1
    assert run.config["model"]["nan_at_step"] == -1 and "nan_at_step" not in run.config  # the config once
    assert not (tmp_path / "metrics.json").exists() and "metrics.json" not in run.files
