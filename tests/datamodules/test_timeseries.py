"""Time-series data: embedded pvlib series, LSTNet txt and METR-LA h5 fixtures, windows, splits, bad input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules.timeseries import TimeSeriesDataModule, WindowDataset


def _series(n=100, c=3):
    t = np.arange(n, dtype=np.float64)[:, None]
    return np.sin(t / 5 + np.arange(c)) * 10 + t / 10 + np.arange(c) * 100


def test_window_dataset_slices_and_counts():
    s = torch.arange(40.0).reshape(20, 2)
    ds = WindowDataset(s, lo=12, hi=20, window=5, horizon=3)
    assert len(ds) == 20 - 3 + 1 - 12  # first targets 12..17
    x, y = ds[0]
    torch.testing.assert_close(x, s[7:12])
    torch.testing.assert_close(y, s[12:15])
    x, y = ds[len(ds) - 1]
    torch.testing.assert_close(y, s[17:20])


def test_embedded_pvlib_solar():
    dm = TimeSeriesDataModule(window=168, horizon=6, batch_size=8)
    dm.setup()
    assert dm.num_variates == 12
    n = 8760
    b1, b2 = int(n * 0.6), int(n * 0.8)
    assert len(dm.datasets["train"]) == b1 - 6 + 1 - 168
    assert len(dm.datasets["val"]) == b2 - b1 - 6 + 1
    assert len(dm.datasets["test"]) == n - b2 - 6 + 1
    train = dm.datasets["train"].series[:b1]
    torch.testing.assert_close(train.mean(0), torch.zeros(12), rtol=0, atol=1e-4)
    torch.testing.assert_close(train.std(0), torch.ones(12), rtol=0, atol=1e-4)
    # GHI of Greensboro (variate 0) is zero at night and peaks near 1000 W/m^2
    raw = dm.datasets["train"].series[:, 0] * dm.std[0] + dm.mean[0]
    assert raw.min().item() == pytest.approx(0.0, abs=1e-3) and 900 < raw.max().item() < 1100
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 168, 12) and y.shape == (8, 6, 12)


def test_lstnet_txt_fixture(tmp_path):
    values = _series(100, 3)
    np.savetxt(tmp_path / "solar_AL.txt", values, delimiter=",", fmt="%.6f")
    dm = TimeSeriesDataModule(dataset="solar_al", source="real", data_dir=str(tmp_path), window=10, horizon=2)
    dm.setup()
    assert len(dm.datasets["train"]) == 60 - 2 + 1 - 10
    assert len(dm.datasets["test"]) == 20 - 2 + 1
    x, y = dm.datasets["test"][0]  # first target step = 80
    restored = y * dm.std + dm.mean
    np.testing.assert_allclose(restored.numpy(), values[80:82], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose((x * dm.std + dm.mean).numpy(), values[70:80], rtol=1e-5, atol=1e-4)


def test_metr_la_h5_fixture(tmp_path):
    pytest.importorskip("tables")
    values = _series(50, 4)
    values[5, 1] = 0.0  # METR-LA's own missing code is kept
    index = pd.date_range("2012-03-01", periods=50, freq="5min")
    pd.DataFrame(values, index=index, columns=["773869", "767541", "767542", "717447"]).to_hdf(
        tmp_path / "metr-la.h5", key="df"
    )
    dm = TimeSeriesDataModule(
        dataset="metr_la", source="real", data_dir=str(tmp_path), window=6, horizon=3, normalize="none"
    )
    dm.setup()
    assert len(dm.datasets["train"]) == 35 - 3 + 1 - 6
    assert len(dm.datasets["val"]) == 40 - 35 - 3 + 1
    x, y = dm.datasets["train"][0]
    np.testing.assert_allclose(x.numpy(), values[0:6], rtol=1e-6)
    assert x[5, 1].item() == 0.0


def test_missing_file_names_it(tmp_path):
    dm = TimeSeriesDataModule(dataset="pems_bay", source="real", data_dir=str(tmp_path))
    with pytest.raises(MissingDataError, match="pems-bay.h5"):
        dm.setup()


def test_non_numeric_cell_names_file_and_row(tmp_path):
    values = _series(30, 2).astype(str)
    values[7, 1] = "abc"
    (tmp_path / "electricity.txt").write_text("\n".join(",".join(r) for r in values))
    dm = TimeSeriesDataModule(dataset="electricity", source="real", data_dir=str(tmp_path), window=3, horizon=1)
    with pytest.raises(DataFormatError, match=r"electricity.txt: row 8 column 2: 'abc'"):
        dm.setup()


def test_nan_error_and_fill_policies(tmp_path):
    values = _series(40, 2)
    values[10, 0] = np.nan
    np.savetxt(tmp_path / "solar_AL.txt", values, delimiter=",", fmt="%.6f")
    kw = dict(dataset="solar_al", source="real", data_dir=str(tmp_path), window=4, horizon=2, normalize="none")
    with pytest.raises(DataFormatError, match=r"solar_AL.txt: NaN at row 10 column 0"):
        TimeSeriesDataModule(**kw).setup()
    dm = TimeSeriesDataModule(nan_policy="ffill", **kw)
    dm.setup()
    assert dm.datasets["train"].series[10, 0].item() == pytest.approx(values[9, 0], abs=1e-5)
    dm = TimeSeriesDataModule(nan_policy="zero", **kw)
    dm.setup()
    assert dm.datasets["train"].series[10, 0].item() == 0.0


def test_window_longer_than_series_is_a_config_error(tmp_path):
    np.savetxt(tmp_path / "solar_AL.txt", _series(30, 2), delimiter=",")
    dm = TimeSeriesDataModule(dataset="solar_al", source="real", data_dir=str(tmp_path), window=40, horizon=2)
    with pytest.raises(ConfigError, match=r"data.window=40 \+ data.horizon=2 do not fit the train split"):
        dm.setup()


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(dataset="traffic"), "data.dataset='traffic'"),
        (dict(dataset="metr_la"), "set data.source=real"),
        (dict(window=0), "data.window=0"),
        (dict(splits=[0.8, 0.3, 0.1]), "data.splits"),
        (dict(nan_policy="drop"), "data.nan_policy='drop'"),
    ],
)
def test_bad_config(kw, match):
    with pytest.raises(ConfigError, match=match):
        TimeSeriesDataModule(**kw)
