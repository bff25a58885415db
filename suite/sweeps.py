"""Hyper-parameter search with Hydra's Optuna sweeper (``hparams_search=<name>``, ``conf/hparams_search/``).

Each trial is one run of the experiment; its objective is the run's ``optimized_metric`` (a validation metric, the
value of its last validation) returned by the train entry point. A trial whose run fails (a non-finite loss, a
sampled combination the module refuses: any one-line suite error but an interruption) or whose metric is not finite
prints ``trial failed: <why>`` and returns ``None``: the sweeper records the trial as failed and the study goes on. A
metric the run never logged is a configuration error and stops the study (every trial would fail the same way).

Every trial writes ``trial.json`` into its run folder (number, state, value, the swept parameters, the error) and
then rewrites the study's history in the multirun folder from all of them: ``optimization_history.csv`` and
``optimization_history.json`` (every trial so far, and the best), beside the ``optimization_results.yaml`` (best
parameters and value) the sweeper writes at the end. A study stopped early keeps the history of its finished
trials.
"""

from __future__ import annotations

import contextlib
import csv
import difflib
import io
import json
import math
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig

from core.errors import ConfigError, Preempted, SuiteError

HISTORY = "optimization_history"
TRIAL_FILE = "trial.json"


def in_search(cfg: DictConfig) -> bool:
    """Whether this run is a trial of a search: a multirun job with an ``optimized_metric``."""
    if not cfg.get("optimized_metric"):
        return False
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except ValueError:  # outside a Hydra run
        return False


def objective(metrics: dict[str, float], key: str) -> float | None:
    """``metrics[key]`` as a float, ``None`` when it is not finite; a key the run never logged is a ConfigError."""
    if key not in metrics:
        close = difflib.get_close_matches(key, sorted(metrics), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ConfigError(f"optimized_metric={key}: the run logged no such metric{hint}")
    value = float(metrics[key])
    return value if math.isfinite(value) else None


def _this_trial() -> tuple[int, dict[str, Any], str]:
    """This job's number, the values the sweeper chose for its ``params`` (from the job's overrides) and the
    study's direction."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    swept = set(hc.sweeper.get("params") or {})
    params = {}
    for override in hc.overrides.task:
        key, _, value = str(override).partition("=")
        if key in swept:
            params[key] = yaml.safe_load(value) if value else value
    return int(hc.job.num), params, str(hc.sweeper.get("direction", "minimize")).lower()


def run_trial(cfg: DictConfig, train: Callable[[DictConfig], dict[str, float]]) -> float | None:
    """Run one trial and write its ``trial.json``; returns the objective, or ``None`` when the trial failed (said
    in one line on stderr)."""
    key = str(cfg.optimized_metric)
    error = None
    try:
        value = objective(train(cfg), key)
        if value is None:
            error = f"{key} is not finite"
    except Preempted:
        raise
    except SuiteError as err:
        if isinstance(err, ConfigError) and str(err).startswith("optimized_metric="):
            raise
        value, error = None, " ".join(str(err).split())
    if error:
        print(f"trial failed: {error}", file=sys.stderr, flush=True)
    number, params, direction = _this_trial()
    record = {"number": number, "state": "FAIL" if value is None else "COMPLETE", "value": value}
    record.update(objective=key, params=params, error=error)
    out = Path(str(cfg.paths.output_dir))
    out.mkdir(parents=True, exist_ok=True)  # a refused run's folder was removed; its trial is still recorded
    (out / TRIAL_FILE).write_text(json.dumps(record, indent=2))
    write_history(out.parent, direction)
    return value


def read_trials(sweep_dir: Path) -> list[dict[str, Any]]:
    """The ``trial.json`` of every run folder of a multirun, by trial number."""
    trials = []
    for path in sweep_dir.glob(f"*/{TRIAL_FILE}"):
        record = json.loads(path.read_text())
        record["run_dir"] = str(path.parent)
        trials.append(record)
    return sorted(trials, key=lambda t: t["number"])


def write_history(sweep_dir: Path, direction: str) -> list[Path]:
    """``optimization_history.csv`` (one row per trial: number, state, value, one column per parameter, run folder,
    error) and ``optimization_history.json`` (the same, with the best trial) in ``sweep_dir``."""
    trials = read_trials(sweep_dir)
    rows = [
        {
            "number": t["number"],
            "state": t["state"],
            "value": t["value"],
            **{f"params.{k}": v for k, v in t["params"].items()},
            "run_dir": t["run_dir"],
            "error": t["error"],
        }
        for t in trials
    ]
    columns = list(dict.fromkeys(k for row in rows for k in row))
    out_csv, out_json = sweep_dir / f"{HISTORY}.csv", sweep_dir / f"{HISTORY}.json"
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    _replace(out_csv, table.getvalue())
    done = [t for t in trials if t["state"] == "COMPLETE"]
    best = (min if direction == "minimize" else max)(done, key=lambda t: t["value"]) if done else None
    objective_key = trials[0]["objective"] if trials else None
    summary = {"objective": objective_key, "direction": direction, "best": best, "trials": trials}
    _replace(out_json, json.dumps(summary, indent=2))
    return [out_csv, out_json]


def _replace(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (two trials of a parallel search may rewrite it at once)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def no_completed_trial_is_one_line() -> Iterator[None]:
    """A search in which every trial failed ends in one line (Optuna: ``No trials are completed yet``) after the
    ``trial failed:`` line of each trial."""
    try:
        yield
    except ValueError as err:
        if "No trials are completed" not in str(err):
            raise
        print("error: hparams_search: no trial completed (each failed: see the 'trial failed:' lines)", file=sys.stderr)
        sys.exit(2)
