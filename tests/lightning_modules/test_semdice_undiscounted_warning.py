"""SEMDICE's official baseline update weighs states by discounted counts; when the datamodule has none (e.g. a
checkpoint that kept only plain counts) the module falls back to the undiscounted counts and says so once per run."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_modules.semdice.tabular import UNDISCOUNTED_WARNING
from ops.semdice import tabular as tb
from suite.build import build
from tests.conftest import compose_train


def _fitted(tmp_path, kind: str = "pb_s"):
    cfg = compose_train(
        [
            "experiment=semdice",
            "logger=none",
            "callbacks=none",
            "trainer.max_epochs=1",
            "trainer.enable_progress_bar=false",
            "data.trajectories_per_epoch=2",
            f"model.kind={kind}",
            "model.baseline_update=official",
        ],
        tmp_path,
    )
    objs = build(cfg)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        objs["trainer"].fit(objs["model"], datamodule=objs["datamodule"])
    return objs["model"], objs["datamodule"], [w for w in caught if str(w.message) == UNDISCOUNTED_WARNING]


def test_a_run_with_discounted_counts_does_not_warn(tmp_path):
    _, dm, fallback = _fitted(tmp_path)
    assert float(dm.discounted_counts.sum()) > 0 and fallback == []


@pytest.mark.parametrize("missing", ["none", "zeros"])
def test_the_undiscounted_fallback_warns_once_per_run(tmp_path, missing):
    model, dm, _ = _fitted(tmp_path)
    dm.discounted_counts = None if missing == "none" else torch.zeros_like(dm.counts)
    with pytest.warns(UserWarning, match="undiscounted counts"):
        model.refresh_data(dm)
    torch.testing.assert_close(model.p_s, tb.discounted_state_distribution(dm.counts.to(model.policy)))
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        for _ in range(3):
            model.refresh_data(dm)
    assert [w for w in again if str(w.message) == UNDISCOUNTED_WARNING] == []  # once per run, not per trajectory
