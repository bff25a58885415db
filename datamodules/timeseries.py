"""Multivariate time-series forecasting data: sliding windows over one ``[N, C]`` series with chronological splits.

Real formats (the TS-LIF paper's datasets, read from ``data_dir``):

* ``metr_la`` / ``pems_bay``: ``metr-la.h5`` / ``pems-bay.h5``, a pandas HDF5 store holding one DataFrame
  ``[T, sensors]`` (key ``df``; as distributed by DCRNN). Zeros are the datasets' own missing-value code and are kept.
  Splits 0.7/0.1/0.2.
* ``solar_al`` / ``electricity``: LSTNet's ``solar_AL.txt`` / ``electricity.txt``: comma-separated floats, one time
  step per row, no header. Splits 0.6/0.2/0.2.

Embedded default (``source=embedded``, no network): ``pvlib_solar``, two real NREL typical-meteorological-year
files shipped inside ``pvlib`` (TMY3 of Greensboro NC and Sand Point AK): 8,760 hourly steps x (GHI, DNI, DHI,
dry-bulb temperature, relative humidity, wind speed) per site = 12 variates. It is the closest packaged analogue of
Solar-AL: a strong daily cycle (low frequency) plus weather-driven high-frequency variation. Splits 0.6/0.2/0.2.

Windows and splits follow LSTNet/SeqSNN: a sample is ``x = s[t - L : t]``, ``y = s[t : t + h]``; a sample belongs
to the split that contains its first target step ``t`` (inputs may reach into the previous split). Values are
z-scored per variate with the training split's mean and std (SeqSNN ``normalize: 3``).

Bad data: a non-numeric cell raises :class:`DataFormatError` naming the file and row; NaNs raise it too unless
``nan_policy`` is ``ffill`` (forward then backward fill per variate) or ``zero``. A window plus horizon longer than a
split raises :class:`ConfigError` at setup naming both sizes.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules._base import SuiteDataModule, require_files

REAL_FILES = {
    "metr_la": "metr-la.h5",
    "pems_bay": "pems-bay.h5",
    "solar_al": "solar_AL.txt",
    "electricity": "electricity.txt",
}
DEFAULT_SPLITS = {
    "pvlib_solar": (0.6, 0.2, 0.2),
    "metr_la": (0.7, 0.1, 0.2),
    "pems_bay": (0.7, 0.1, 0.2),
    "solar_al": (0.6, 0.2, 0.2),
    "electricity": (0.6, 0.2, 0.2),
}
HOW_TO_GET = (
    "METR-LA/PEMS-BAY .h5: https://github.com/liyaguang/DCRNN (Google Drive link in its README); solar_AL.txt and "
    "electricity.txt: https://github.com/laiguokun/multivariate-time-series-data (gunzip the .txt.gz files)."
)
NAN_POLICIES = ("error", "ffill", "zero")
PVLIB_FILES = ("723170TYA.CSV", "703165TY.csv")
PVLIB_COLUMNS = ("GHI (W/m^2)", "DNI (W/m^2)", "DHI (W/m^2)", "Dry-bulb (C)", "RHum (%)", "Wspd (m/s)")


class WindowDataset(Dataset):
    """Sliding windows over ``series [N, C]`` whose first target step lies in ``[lo, hi)``.

    Item ``i``: ``(x [L, C], y [h, C])`` with ``t = max(lo, L) + i``, ``x = series[t-L:t]``, ``y = series[t:t+h]``.
    """

    def __init__(self, series: torch.Tensor, lo: int, hi: int, window: int, horizon: int, name: str = "") -> None:
        self.series, self.window, self.horizon = series, window, horizon
        self.start = max(lo, window)
        self.n = hi - horizon + 1 - self.start
        if self.n < 1:
            raise ConfigError(
                f"data.window={window} + data.horizon={horizon} do not fit the {name or 'split'} of the series "
                f"(target steps {lo}..{hi - 1} of {len(series)}): no complete sample; use a shorter window/horizon"
            )

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.start + i
        return self.series[t - self.window : t], self.series[t : t + self.horizon]


def _handle_nans(values: np.ndarray, path: str, policy: str) -> np.ndarray:
    bad = np.isnan(values)
    if not bad.any():
        return values
    if policy == "error":
        row, col = np.argwhere(bad)[0]
        raise DataFormatError(
            f"{path}: NaN at row {row} column {col} ({int(bad.sum())} NaN cells in all); "
            f"set data.nan_policy=ffill or zero to fill them"
        )
    if policy == "zero":
        return np.where(bad, 0.0, values)
    filled = pd.DataFrame(values).ffill().bfill().to_numpy()
    return np.where(np.isnan(filled), 0.0, filled)  # an all-NaN column becomes zeros


def read_lstnet_txt(path: str | Path) -> np.ndarray:
    """LSTNet ``.txt``: comma-separated floats, no header -> ``[N, C]`` float64 (NaN where a cell is empty)."""
    path = str(path)
    try:
        df = pd.read_csv(path, header=None, dtype=str, keep_default_na=False)
    except pd.errors.ParserError as err:
        raise DataFormatError(f"{path}: malformed LSTNet txt ({str(err).strip().splitlines()[0]})") from None
    except pd.errors.EmptyDataError:
        raise DataFormatError(f"{path}: file is empty") from None
    stripped = df.apply(lambda col: col.str.strip())
    text = stripped.to_numpy()
    is_nan_token = np.isin(np.char.lower(text.astype(str)), ["", "nan", "na"])
    num = stripped.apply(pd.to_numeric, errors="coerce").to_numpy(dtype=np.float64)
    bad = np.isnan(num) & ~is_nan_token
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise DataFormatError(f"{path}: row {row + 1} column {col + 1}: {text[row, col]!r} is not a number")
    return num


def read_h5_frame(path: str | Path) -> np.ndarray:
    """METR-LA/PEMS-BAY ``.h5`` (pandas HDF store, one DataFrame ``[T, sensors]``) -> ``[T, C]`` float64."""
    path = str(path)
    try:
        with pd.HDFStore(path, mode="r") as store:
            keys = store.keys()
            if not keys:
                raise DataFormatError(f"{path}: HDF5 store holds no DataFrame")
            df = store["df"] if "/df" in keys else store[keys[0]]
    except ImportError as err:
        raise MissingDataError(f"{path}: reading .h5 needs PyTables (`pip install tables`): {err}") from None
    except (OSError, ValueError, TypeError, RuntimeError) as err:  # RuntimeError: PyTables' HDF5ExtError
        if isinstance(err, DataFormatError):
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        reason = type(err).__name__ if "back trace" in first or not first else first[:160]
        raise DataFormatError(
            f"{path}: not a readable pandas HDF5 store ({reason}); download the file again (the DCRNN release)"
        ) from None
    try:
        return df.to_numpy(dtype=np.float64)
    except (ValueError, TypeError) as err:
        raise DataFormatError(f"{path}: non-numeric column in the DataFrame ({err})") from None


def _pvlib_data_dir() -> str:
    """pvlib's bundled ``data/`` folder, found without importing pvlib (its import alone takes seconds)."""
    spec = importlib.util.find_spec("pvlib")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDataError("the embedded series needs the `pvlib` package (`pip install pvlib==0.16.1`)")
    return os.path.join(list(spec.submodule_search_locations)[0], "data")


@functools.lru_cache(maxsize=1)
def load_pvlib_solar() -> np.ndarray:
    """The embedded ``[8760, 12]`` series: pvlib's two TMY3 files (Greensboro NC, Sand Point AK), hourly GHI, DNI,
    DHI, dry-bulb temperature, relative humidity and wind speed per site.

    TMY3 is a plain CSV (one metadata line, then a header); it is read with pandas directly, which is what
    ``pvlib.iotools.read_tmy3`` does too, minus a multi-second ``import pvlib``.
    """
    root = _pvlib_data_dir()
    blocks = []
    for name in PVLIB_FILES:
        path = os.path.join(root, name)
        if not os.path.exists(path):
            raise MissingDataError(f"missing embedded data file {path} (reinstall pvlib==0.16.1)")
        df = pd.read_csv(path, skiprows=1, usecols=list(PVLIB_COLUMNS))
        blocks.append(df[list(PVLIB_COLUMNS)].to_numpy(dtype=np.float64))
    return np.concatenate(blocks, 1)


class TimeSeriesDataModule(SuiteDataModule):
    """Forecasting windows over one multivariate series.

    Args:
        dataset: ``pvlib_solar`` (embedded) or a real format: ``metr_la``, ``pems_bay``, ``solar_al``,
            ``electricity``.
        window: Input length ``L`` (paper: 168).
        horizon: Forecast length ``h`` (paper: 6, 24, 48, 96).
        splits: Chronological train/val/test fractions; ``None`` uses the dataset's (see module docstring).
        normalize: ``zscore`` (per variate, training-split stats) or ``none``.
        nan_policy: ``error``, ``ffill`` or ``zero`` (see module docstring).
        max_variates: Keep only the first ``C`` variates (``None``: all).
        source, data_dir, batch_size, num_workers, seed: see :class:`SuiteDataModule`.
    """

    def __init__(
        self,
        dataset: str = "pvlib_solar",
        window: int = 168,
        horizon: int = 6,
        splits: tuple[float, float, float] | list[float] | None = None,
        normalize: str = "zscore",
        nan_policy: str = "error",
        max_variates: int | None = None,
        source: str = "embedded",
        data_dir: str = "data",
        batch_size: int = 32,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(source=source, data_dir=data_dir, batch_size=batch_size, num_workers=num_workers, seed=seed)
        if dataset not in DEFAULT_SPLITS:
            raise ConfigError(f"data.dataset={dataset!r} must be one of {list(DEFAULT_SPLITS)}")
        if source == "embedded" and dataset != "pvlib_solar":
            raise ConfigError(
                f"data.dataset={dataset!r} is a real format: set data.source=real (embedded: pvlib_solar)"
            )
        if source == "real" and dataset not in REAL_FILES:
            raise ConfigError(f"data.source=real needs data.dataset in {list(REAL_FILES)}, got {dataset!r}")
        if window < 1 or horizon < 1:
            raise ConfigError(f"data.window={window} and data.horizon={horizon} must be >= 1")
        splits = tuple(DEFAULT_SPLITS[dataset] if splits is None else splits)
        if len(splits) != 3 or any(f <= 0 for f in splits) or sum(splits) > 1 + 1e-9:
            raise ConfigError(f"data.splits={list(splits)} must be three fractions > 0 summing to <= 1")
        if normalize not in ("zscore", "none"):
            raise ConfigError(f"data.normalize={normalize!r} must be 'zscore' or 'none'")
        if nan_policy not in NAN_POLICIES:
            raise ConfigError(f"data.nan_policy={nan_policy!r} must be one of {list(NAN_POLICIES)}")
        if max_variates is not None and max_variates < 1:
            raise ConfigError(f"data.max_variates={max_variates} must be >= 1 or null")
        self.dataset, self.window, self.horizon, self.splits = dataset, window, horizon, splits
        self.normalize, self.nan_policy, self.max_variates = normalize, nan_policy, max_variates
        self.mean: torch.Tensor | None = None
        self.std: torch.Tensor | None = None

    # -- loading ----------------------------------------------------------------------------------------------------
    def load_embedded(self) -> dict[str, Any]:
        return self._windows(load_pvlib_solar().copy(), "pvlib/data TMY files")

    def load_real(self) -> dict[str, Any]:
        (path,) = require_files(self.data_dir, [REAL_FILES[self.dataset]], HOW_TO_GET)
        values = read_h5_frame(path) if path.suffix == ".h5" else read_lstnet_txt(path)
        return self._windows(values, str(path))

    def _windows(self, values: np.ndarray, path: str) -> dict[str, Any]:
        if values.ndim != 2 or values.shape[0] < 2 or values.shape[1] < 1:
            raise DataFormatError(f"{path}: expected a [time, variates] table, got shape {values.shape}")
        if self.max_variates is not None:
            values = values[:, : self.max_variates]
        values = _handle_nans(values, path, self.nan_policy)
        if np.isinf(values).any():
            row, col = np.argwhere(np.isinf(values))[0]
            raise DataFormatError(f"{path}: infinite value at row {row} column {col}")
        n = len(values)
        b1 = int(n * self.splits[0])
        b2 = int(n * (self.splits[0] + self.splits[1]))
        b3 = min(n, int(round(n * sum(self.splits))))
        series = torch.from_numpy(np.array(values, dtype=np.float32))
        if self.normalize == "zscore":
            train = series[:b1]
            self.mean = train.mean(0)
            self.std = train.std(0).clamp_min(1e-6)  # constant variates stay finite
            series = (series - self.mean) / self.std
        w, h = self.window, self.horizon
        return {
            "train": WindowDataset(series, 0, b1, w, h, "train split"),
            "val": WindowDataset(series, b1, b2, w, h, "val split"),
            "test": WindowDataset(series, b2, b3, w, h, "test split"),
        }

    @property
    def num_variates(self) -> int:
        self.setup()
        return self.datasets["train"].series.shape[1]
