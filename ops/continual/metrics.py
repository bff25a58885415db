"""Average performance, average forgetting and backward transfer from an accuracy matrix.

``acc[j][i]`` is the accuracy on task ``j`` after training task ``i`` (only ``j <= i`` is read). As the N-ForGOT
code (``utils/utils.py::calculate_avg_performance_forgetting``) defines them, after task ``i``:

    AP_i  = mean_{j <= i} acc[j][i]
    AF_i  = mean_{j < i} max(acc[j][j] - acc[j][i], 0)        (i >= 1)
    BWT_i = mean_{j < i} (acc[j][i] - acc[j][j])              (i >= 1; negative = forgetting)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _matrix(acc: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    a = np.asarray(acc, dtype=float)
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"accuracy matrix must be square [T, T], got shape {a.shape}")
    return a


def average_performance(acc: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    """``[T]``: AP_i for every task ``i``."""
    a = _matrix(acc)
    return np.array([a[: i + 1, i].mean() for i in range(a.shape[0])])


def average_forgetting(acc: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    """``[T - 1]``: AF_i for ``i = 1 .. T-1``."""
    a = _matrix(acc)
    return np.array([np.maximum(np.diag(a)[:i] - a[:i, i], 0.0).mean() for i in range(1, a.shape[0])])


def backward_transfer(acc: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    """``[T - 1]``: BWT_i for ``i = 1 .. T-1``."""
    a = _matrix(acc)
    return np.array([(a[:i, i] - np.diag(a)[:i]).mean() for i in range(1, a.shape[0])])
