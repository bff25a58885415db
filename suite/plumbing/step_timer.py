"""Wall time per training step, written once at the end of fit (sizing a claim on a new machine)."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer


class StepTimer(Callback):
    """Record the wall time between consecutive training-batch ends and write a summary to ``path``.

    The interval between two batch ends covers everything a step costs in a real run (data loading, forward,
    backward, optimiser, logging, callbacks) except validation, whose loops are timed apart: an interval that spans a
    validation loop has that loop's time removed. The first ``warmup`` intervals (CUDA/cuDNN autotuning, Triton
    compilation, allocator growth) are left out of the median and mean. Rank zero writes::

        {"steps": 800, "median_s": 0.012, "mean_s": 0.013, "train_s": 10.4, "val_s": 2.1, "fit_s": 13.0, ...}

    Args:
        path: JSON file to write; default ``step_times.json`` in the trainer's ``default_root_dir`` (the run folder).
        warmup: intervals left out of ``median_s`` / ``mean_s``.
    """

    def __init__(self, path: str | os.PathLike | None = None, warmup: int = 10) -> None:
        if warmup < 0:
            raise ValueError(f"StepTimer warmup must be >= 0, got {warmup}")
        self.path = None if path is None else Path(path)
        self.warmup = warmup
        self._last: float | None = None
        self._val_s = 0.0
        self._val_since_last = 0.0
        self._val_start: float | None = None
        self._fit_start = 0.0
        self.intervals: list[float] = []

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._fit_start = time.perf_counter()
        self._last, self._val_s, self._val_since_last, self.intervals = None, 0.0, 0.0, []

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.intervals.append(now - self._last - self._val_since_last)
        self._last, self._val_since_last = now, 0.0

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._val_start is not None:
            spent = time.perf_counter() - self._val_start
            self._val_s += spent
            self._val_since_last += spent
            self._val_start = None

    def summary(self) -> dict[str, float | int]:
        kept = self.intervals[self.warmup :] or self.intervals
        return {
            "steps": len(self.intervals) + (self._last is not None),
            "median_s": statistics.median(kept) if kept else float("nan"),
            "mean_s": statistics.fmean(kept) if kept else float("nan"),
            "train_s": sum(self.intervals),
            "val_s": self._val_s,
            "fit_s": time.perf_counter() - self._fit_start,
            "warmup": self.warmup,
        }

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.is_global_zero:
            path = self.path or Path(trainer.default_root_dir) / "step_times.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.summary(), indent=1))
