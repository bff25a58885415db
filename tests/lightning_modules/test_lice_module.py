"""LiceLitModule end to end on the synthetic set: classifier training, then every counterfactual method."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from omegaconf import ListConfig

from core.errors import ConfigError
from datamodules.tabular import TabularDataModule
from lightning_modules.lice import LiceLitModule


def test_fit_then_counterfactuals(tmp_path: Path):
    pl.seed_everything(0, verbose=False)
    dm = TabularDataModule(dataset="synthetic", n_synthetic=1200, batch_size=64, seed=0)
    model = LiceLitModule(
        optimizer=partial(torch.optim.AdamW, lr=1e-2),
        hidden_sizes=ListConfig([8, 4]),
        num_counterfactuals=4,
        time_limit=30,
        spn_min_instances=100,
        dice_samples=500,
    )
    trainer = pl.Trainer(
        max_epochs=8,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    trainer.fit(model, datamodule=dm)
    trainer.test(model, datamodule=dm, verbose=False)
    m = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert m["test/acc"] > 0.85  # the rule x0 + x1 > 0 is learnable
    tau = m["test/threshold"]
    records = json.loads((tmp_path / "counterfactuals.json").read_text())
    assert len(records) == 4 * 4
    by = {(r["row"], r["method"]): r for r in records}
    rows = sorted({r["row"] for r in records})
    compared = 0
    for row in rows:
        mio, thr, opt = by[(row, "mio")], by[(row, "lice_threshold")], by[(row, "lice_optimize")]
        assert mio["status"] == "optimal" and mio["valid"]
        assert opt["status"] == "optimal" and opt["valid"]
        # MIO is the distance optimum; LiCE-optimise trades distance for likelihood (same feasible set)
        assert opt["distance"] >= mio["distance"] - 1e-5
        assert opt["distance"] - 0.1 * opt["spn_max"] <= mio["distance"] - 0.1 * mio["spn_max"] + 1e-5
        assert opt["spn_max"] <= opt["spn_ll"] + 1e-9 and opt["mio_value"] == pytest.approx(opt["spn_max"], abs=1e-5)
        if thr["status"] == "optimal":
            compared += 1
            assert thr["valid"] and thr["spn_ll"] >= tau - 1e-6
            assert thr["distance"] >= mio["distance"] - 1e-5
        assert "true_ll" in mio  # the synthetic set has a known density
    assert compared >= 2
    assert m["test/lice_threshold/plausible"] == pytest.approx(1.0)
    assert m["test/mio/valid"] == pytest.approx(1.0) and m["test/dice/found"] > 0
    assert np.isfinite(m["test/lice_optimize/true_ll"])
    # the checkpoint's hyper-parameters load with weights_only=True (no OmegaConf / numpy objects inside)
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    state = torch.load(tmp_path / "last.ckpt", weights_only=True)
    assert state["hyper_parameters"]["hidden_sizes"] == [8, 4]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"methods": ["lice", "mio"]}, "model.methods"),
        ({"threshold": "mean"}, "model.threshold"),
        ({"hidden_sizes": []}, "model.hidden_sizes"),
        ({"spn_bins": 0}, "model.spn_bins"),
        ({"time_limit": 0}, "model.time_limit"),
    ],
)
def test_bad_config(kwargs: dict, match: str):
    with pytest.raises(ConfigError, match=match):
        LiceLitModule(**kwargs)
