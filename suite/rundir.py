"""The files of a run folder that more than one part of the suite reads: the command-line overrides Hydra saved
(``.hydra/overrides.yaml``), the CSV log's curves (``csv/metrics.csv``), the step-0 metrics
(``start_metrics.json``, :mod:`suite.start_metrics`) and what the run ran on (``devices.json``)."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

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


DEVICES_FILE = "devices.json"


def write_devices(run_dir: Path, ran: dict[str, Any], resumed_at: int | None = None) -> None:
    """Record what a run's process runs on (``devices.json``: a list of ``{"from_step", "accelerator", "devices",
    "num_nodes", "world_size", "strategy"[, "device_name"]}``). A fresh run (``resumed_at=None``) starts the list; a
    resumed one adds an entry from its step when it runs on something else."""
    path = Path(run_dir) / DEVICES_FILE
    entries = read_devices(run_dir) if resumed_at is not None else []
    if not entries or {k: v for k, v in entries[-1].items() if k != "from_step"} != ran:
        entries.append({"from_step": int(resumed_at or 0), **ran})
    path.write_text(json.dumps(entries, indent=2) + "\n")


def read_devices(run_dir: Path) -> list[dict[str, Any]]:
    """The entries of a run's ``devices.json`` (``[]`` when there is none or it is unreadable)."""
    try:
        data = json.loads((Path(run_dir) / DEVICES_FILE).read_text())
    except (OSError, ValueError):
        return []
    return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []


def devices_label(entries: list[dict[str, Any]]) -> str | None:
    """What a run ran on, as compared runs are labelled: ``cpu``, ``gpu×4 ddp``, ``cpu×2 ddp`` (one device per
    process), entries of a resumed run joined by ``then``; ``None`` without a record."""
    parts = []
    for e in entries:
        n = int(e.get("world_size") or 1)
        part = str(e.get("accelerator", "?")) + (f"×{n} {e.get('strategy', '?')}" if n > 1 else "")
        if not parts or parts[-1] != part:
            parts.append(part)
    return " then ".join(parts) or None
