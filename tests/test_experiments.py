"""Every experiment config composes, instantiates and runs one fast_dev_run batch on its embedded data.

Parametrised over ``conf/experiment/*.yaml``: a new paper is covered by adding its experiment file.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from suite.run import train
from tests.conftest import ROOT, compose_train

SLUGS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


def test_there_are_experiments():
    assert "leaderbot" in SLUGS, "leaderbot is the default experiment and must exist"


@pytest.mark.parametrize("slug", SLUGS)
def test_experiment_fast_dev_run(slug: str, tmp_path: Path):
    cfg = compose_train([f"experiment={slug}", "debug=fdr", "logger=csv"], tmp_path)
    assert cfg.experiment_slug == slug, "an experiment must set experiment_slug to its file name"
    metrics = train(cfg)
    assert metrics, f"{slug}: fast_dev_run logged no metrics"
    assert all(math.isfinite(v) for v in metrics.values()), f"{slug}: non-finite metric in {metrics}"
