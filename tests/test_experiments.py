"""Every experiment config composes, instantiates and runs one fast_dev_run batch on its embedded data, and its
checkpoint loads without executing pickled code.

Parametrised over ``conf/experiment/*.yaml``: a new paper is covered by adding its experiment file.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from callbacks.run_config import ConfigInCheckpoint
from suite.run import build
from tests.conftest import ROOT, compose_train

SLUGS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


def test_there_are_experiments():
    assert "leaderbot" in SLUGS, "leaderbot is the default experiment and must exist"


@pytest.mark.parametrize("slug", SLUGS)
def test_experiment_fast_dev_run(slug: str, tmp_path: Path):
    cfg = compose_train([f"experiment={slug}", "debug=fdr", "logger=csv"], tmp_path)
    assert cfg.experiment_slug == slug, "an experiment must set experiment_slug to its file name"
    objs = build(cfg)
    trainer = objs["trainer"]
    trainer.fit(objs["model"], datamodule=objs["datamodule"])
    assert any(isinstance(cb, ConfigInCheckpoint) for cb in trainer.callbacks)
    path = tmp_path / "fdr.ckpt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=True)  # raises if the checkpoint would need to unpickle code
    assert f"experiment_slug: {slug}" in state["suite_config_yaml"]
    assert state["state_dict"] or slug == "leaderbot_elo", f"{slug}: empty state_dict"
    trainer.test(objs["model"], datamodule=objs["datamodule"])
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}
    assert metrics, f"{slug}: fast_dev_run logged no metrics"
    assert all(math.isfinite(v) for v in metrics.values()), f"{slug}: non-finite metric in {metrics}"
