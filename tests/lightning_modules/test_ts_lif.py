"""TSLIFLitModule: config errors, missing-data mode, R^2/RSE, neuron summary, learning, a Lightning run."""

from __future__ import annotations

import functools
import math

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from core.errors import ConfigError
from datamodules.timeseries import TimeSeriesDataModule
from lightning_modules.ts_lif import TSLIFLitModule, introduce_missing_values, neuron_summary
from lightning_modules.ts_lif.module import forecast_metrics


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(backbone="lstm"), "model.backbone='lstm'"),
        (dict(neuron="alif"), "model.neuron='alif'"),
        (dict(missing_ratio=1.0), r"model.missing_ratio has 1.0"),
        (dict(test_missing_ratios=[0.1, -0.2]), r"model.test_missing_ratios has -0.2"),
        (dict(neuron="lif", dendritic_spike=False), "apply to neuron=ts_lif only"),
        (dict(hidden=0), "model.hidden=0"),
    ],
)
def test_bad_config(kw, match):
    with pytest.raises(ConfigError, match=match):
        TSLIFLitModule(**kw)


def test_horizon_mismatch_is_a_config_error():
    m = TSLIFLitModule(hidden=4, horizon=3)
    with pytest.raises(ConfigError, match="model.horizon=3 but the data gives horizon 5"):
        m.training_step((torch.randn(2, 8, 2), torch.randn(2, 5, 2)), 0)


def test_introduce_missing_values_ratio():
    x = torch.ones(200, 500)
    g = torch.Generator().manual_seed(0)
    out = introduce_missing_values(x, 0.3, g)
    assert set(out.unique().tolist()) == {0.0, 1.0}
    assert (out == 0).float().mean().item() == pytest.approx(0.3, abs=0.005)
    assert introduce_missing_values(x, 0.0) is x


def test_missing_mode_masks_are_seeded_in_eval_and_random_in_train():
    m = TSLIFLitModule(hidden=4, missing_ratio=0.5)
    x = torch.ones(4, 10, 3)
    torch.testing.assert_close(m._mask(x, 0.5, "test", 3), m._mask(x, 0.5, "test", 3))
    assert not torch.equal(m._mask(x, 0.5, "test", 3), m._mask(x, 0.5, "test", 4))
    assert not torch.equal(m._mask(x, 0.5, "train", 3), m._mask(x, 0.5, "train", 3))


def test_r2_and_rse_by_hand():
    pred = torch.tensor([1.0, 2.0, 4.0, 3.0])
    target = torch.tensor([1.0, 3.0, 3.0, 5.0])
    m = forecast_metrics("test")
    out = m(pred, target)
    sse, sst = 0 + 1 + 1 + 4, (1 - 3) ** 2 + 0 + 0 + (5 - 3) ** 2
    assert out["test/r2"].item() == pytest.approx(1 - sse / sst)
    assert out["test/rse"].item() == pytest.approx(math.sqrt(sse / sst))
    assert out["test/mae"].item() == pytest.approx(1.0)


def test_neuron_summary_at_initialisation():
    s = neuron_summary(TSLIFLitModule(hidden=4).net)
    assert s["gain_dend_0"] == pytest.approx(7 / 6, abs=1e-5)
    assert s["gain_soma_0"] == pytest.approx(1 / 3, abs=1e-5)
    assert s["gain_dend_pi"] == pytest.approx(3 / 22, abs=1e-5)
    assert s["spectral_radius"] == pytest.approx(0.9188, abs=1e-4)
    assert neuron_summary(TSLIFLitModule(hidden=4, backbone="gru_ref").net) == {}
    assert neuron_summary(TSLIFLitModule(hidden=4, neuron="tc_lif").net)["d3"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("backbone,neuron", [("gru", "ts_lif"), ("tcn", "ts_lif"), ("gru", "lif")])
def test_fits_one_batch(backbone, neuron):
    torch.manual_seed(0)
    t = torch.arange(16 + 4, dtype=torch.float32)
    series = torch.stack([torch.sin(t / 3 + k) * (1 + k) for k in range(3)], 1)  # [20, 3]
    x = torch.stack([series[i : i + 12] for i in range(4)])
    y = torch.stack([series[i + 12 : i + 16] for i in range(4)])
    m = TSLIFLitModule(backbone=backbone, neuron=neuron, hidden=8, horizon=4, num_steps=2, theta=0.5)
    opt = torch.optim.Adam(m.parameters(), lr=2e-2)
    first = None
    for _ in range(30):
        loss = m.loss_fn(m(x), y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first


@functools.cache
def _fixture_dir(tmp_root: str) -> str:
    t = np.arange(300)[:, None]
    np.savetxt(f"{tmp_root}/solar_AL.txt", np.sin(t / 4 + np.arange(3)) + 0.01 * t, delimiter=",")
    return tmp_root


def test_lightning_run_logs_all_metrics(tmp_path):
    dm = TimeSeriesDataModule(
        dataset="solar_al", source="real", data_dir=_fixture_dir(str(tmp_path)), window=24, horizon=4, batch_size=8
    )
    model = TSLIFLitModule(
        hidden=8, horizon=4, test_missing_ratios=[0.3], optimizer=functools.partial(torch.optim.Adam, lr=1e-3)
    )
    trainer = pl.Trainer(
        max_steps=2,
        limit_val_batches=1,
        limit_test_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(model, datamodule=dm)
    trainer.test(model, datamodule=dm, verbose=False)
    m = trainer.callback_metrics
    for key in ("test/r2", "test/rse", "test/mae", "test/r2_miss30", "test/rse_miss30", "neuron/spectral_radius"):
        assert key in m and torch.isfinite(m[key]), key
    assert m["test/rse"].item() == pytest.approx(math.sqrt(max(0.0, 1 - m["test/r2"].item())), abs=1e-4)
