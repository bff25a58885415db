"""GaussianMixtureDataModule: presets, exact samples, the mixture.json real-format loader and its errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules.mixtures import GaussianMixtureDataModule, make_mixture, read_mixture_json


def test_ring_preset_geometry_and_samples():
    w, mu, cov = make_mixture("ring2d", n_components=8, scale=2.0, component_std=0.3)
    assert torch.allclose(mu.norm(dim=1), torch.full((8,), 2.0, dtype=torch.float64))
    assert torch.allclose(cov, 0.09 * torch.eye(2, dtype=torch.float64).expand(8, 2, 2))
    dm = GaussianMixtureDataModule(n_train=4000, n_val=10, n_test=20, batch_size=100, seed=3)
    dm.setup()
    x = dm.datasets["train"].tensors[0]
    assert x.shape == (4000, 2) and x.dtype == torch.float32
    assert abs(float(x.norm(dim=1).mean()) - 2.0) < 0.05 and float(x.mean(0).abs().max()) < 0.1
    (batch,) = next(iter(dm.train_dataloader()))
    assert batch.shape == (100, 2)
    dm2 = GaussianMixtureDataModule(n_train=4000, n_val=10, n_test=20, seed=3)
    dm2.setup()
    assert torch.equal(dm2.datasets["train"].tensors[0], x)
    assert not torch.equal(dm.datasets["test"].tensors[0], dm.datasets["val"].tensors[0][:20].repeat(2, 1)[:20])


def test_random_preset_high_dim_moments():
    w, mu, cov = make_mixture("random", dim=5, n_components=3, seed=1)
    dm = GaussianMixtureDataModule(preset="random", dim=5, n_components=3, n_train=20000, seed=1)
    dm.setup()
    x = dm.datasets["train"].tensors[0].double()
    mean = (w[:, None] * mu).sum(0)
    assert torch.allclose(x.mean(0), mean, atol=0.1)
    assert torch.allclose(torch.linalg.eigvalsh(cov), torch.linalg.eigvalsh(cov).clamp_min(1e-6))


def test_bad_config():
    with pytest.raises(ConfigError, match="data.preset='moons'"):
        GaussianMixtureDataModule(preset="moons")
    with pytest.raises(ConfigError, match="data.dim=3 must be 2"):
        GaussianMixtureDataModule(preset="ring2d", dim=3)
    with pytest.raises(ConfigError, match="data.n_test=0"):
        GaussianMixtureDataModule(n_test=0)


def test_real_loader_reads_fixture(tmp_path):
    obj = {
        "weights": [0.25, 0.75],
        "means": [[0.0, 1.0], [3.0, -1.0]],
        "covs": [[[1.0, 0.2], [0.2, 0.5]], [[0.1, 0], [0, 0.1]]],
    }
    (tmp_path / "mixture.json").write_text(json.dumps(obj))
    dm = GaussianMixtureDataModule(source="real", data_dir=str(tmp_path), n_train=8000, n_val=4, n_test=4)
    dm.setup()
    w, mu, cov = dm.mixture
    assert w.tolist() == [0.25, 0.75] and cov.shape == (2, 2, 2)
    x = dm.datasets["train"].tensors[0].double()
    assert math.isclose(float(x[:, 0].mean()), 0.25 * 0 + 0.75 * 3, abs_tol=0.1)


def test_real_loader_errors_name_file_and_row(tmp_path):
    dm = GaussianMixtureDataModule(source="real", data_dir=str(tmp_path))
    with pytest.raises(MissingDataError, match="mixture.json"):
        dm.setup()
    path = tmp_path / "mixture.json"
    path.write_text(json.dumps({"weights": [0.5, 0.5], "means": [[0.0], [1.0]], "covs": [[[1.0]], [[-1.0]]]}))
    with pytest.raises(DataFormatError, match=r"mixture.json: covs row 1"):
        read_mixture_json(path)
    path.write_text(json.dumps({"weights": [0.5, 0.5], "means": [[0.0], [1.0]]}))
    with pytest.raises(DataFormatError, match="missing field 'covs'"):
        read_mixture_json(path)
    path.write_text("{not json")
    with pytest.raises(DataFormatError, match="not valid JSON"):
        read_mixture_json(path)


def test_sgm_lipschitz_laws_segment_and_logconcave():
    """segment2d: uniform on [-1, 1] x {0}; logconcave1d: rejection draws match the density's moments (quadrature)."""
    dm = GaussianMixtureDataModule(preset="segment2d", n_train=4000, n_val=10, n_test=20, seed=1)
    dm.setup()
    x = dm.datasets["train"].tensors[0]
    assert dm.mixture is None and x.shape == (4000, 2) and float(x[:, 1].abs().max()) == 0.0
    assert float(x[:, 0].abs().max()) <= 1.0 and abs(float(x[:, 0].var()) - 1 / 3) < 0.03
    dm = GaussianMixtureDataModule(preset="logconcave1d", n_train=20000, n_val=10, n_test=20, seed=1)
    dm.setup()
    y = dm.datasets["train"].tensors[0].double()
    grid = torch.linspace(-12, 12, 24001, dtype=torch.float64)
    p = torch.exp(-0.25 * grid**2 - torch.log(torch.cosh(grid)))
    var = float((grid**2 * p).sum() / p.sum())
    assert y.shape == (20000, 1) and abs(float(y.var()) - var) < 0.05 * var and abs(float(y.mean())) < 0.05
    with pytest.raises(ConfigError, match="needs data.source=embedded"):
        GaussianMixtureDataModule(preset="segment2d", source="real")
