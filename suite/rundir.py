"""The files of a run folder that more than one part of the suite reads: the command-line overrides Hydra saved
(``.hydra/overrides.yaml``), the CSV log's curves (``csv/metrics.csv``) and the step-0 metrics
(``start_metrics.json``, :mod:`suite.start_metrics`)."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

import yaml

START = "@start"
START_FILE = "start_metrics.json"


def read_overrides(run_dir: Path) -> list[str] | None:
    """The command-line overrides a run was started with (``.hydra/overrides.yaml``); None when the file is missing
    or unreadable."""
    f = Path(run_dir) / ".hydra" / "overrides.yaml"
    try:
        return list(yaml.safe_load(f.read_text()) or []) if f.exists() else None
    except (OSError, yaml.YAMLError):
        return None


def read_csv_curves(csv_file: Path) -> dict[str, list[tuple[int, float]]]:
    """Every metric's ``(step, value)`` pairs in a CSV log (Lightning's ``metrics.csv``), in file order."""
    curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
    with Path(csv_file).open() as fh:
        for row in csv.DictReader(fh):
            step = int(float(row.get("step") or 0))
            for key, value in row.items():
                if key in ("step", "epoch") or value in (None, ""):
                    continue
                try:
                    curves[key].append((step, float(value)))
                except ValueError:
                    continue
    return dict(curves)


def start_key(key: str) -> str:
    """The ``metrics.json`` key of ``key``'s step-0 value: ``val/loss`` -> ``val/loss@start``."""
    return f"{key}{START}"


def write_start(run_dir: Path, metrics: dict[str, float]) -> None:
    """Write ``start_metrics.json`` (an empty dict removes it: a fresh run never keeps an earlier run's start)."""
    path = Path(run_dir) / START_FILE
    if metrics:
        path.write_text(json.dumps(metrics, indent=2, sort_keys=True))
    else:
        path.unlink(missing_ok=True)


def read_start(run_dir: Path) -> dict[str, float]:
    """The ``<key>@start`` values a run's step-0 evaluation wrote (``{}`` when there is none or it is unreadable)."""
    try:
        data = json.loads((Path(run_dir) / START_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)} if isinstance(data, dict) else {}
