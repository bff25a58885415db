"""Sweeps as the README shows them: an Optuna search (`make sweep METHOD=leaderbot ARGS="hparams_search=leaderbot"`)
writes its best trial and the history of every trial beside the multirun, a failed trial is recorded and the study
goes on; `make sweep ... JOBS=2` runs two one-thread jobs at once through Hydra's joblib launcher."""

from __future__ import annotations

import csv
import json
import math
import subprocess
from pathlib import Path

import pytest
import yaml

from core.errors import ConfigError
from suite.sweeps import objective
from tests._helpers.make import run_make
from tests.conftest import FIXTURE_CONF, compose_train, run_cli


def _make(*args: str) -> subprocess.CompletedProcess:
    return run_make(*args, timeout=900)


def _one(pattern: str, root: Path) -> Path:
    (found,) = root.glob(pattern)
    return found


def _history(sweep: Path) -> list[dict]:
    with (sweep / "optimization_history.csv").open() as f:
        return list(csv.DictReader(f))


def test_the_objective_is_the_metric_none_when_not_finite_and_a_missing_key_is_a_config_error():
    assert objective({"val/nll": 1.25}, "val/nll") == 1.25
    assert objective({"val/nll": math.nan}, "val/nll") is None
    assert objective({"val/nll": math.inf}, "val/nll") is None
    with pytest.raises(ConfigError, match=r"optimized_metric=val/nlll: the run logged no such metric \(did you mean"):
        objective({"val/nll": 1.0, "test/nll": 1.0}, "val/nlll")


def test_make_sweep_jobs_adds_the_joblib_launcher_only_when_asked():
    plain = _make("-n", "sweep", "METHOD=leaderbot", "ARGS=seed=0,1").stdout
    two = _make("-n", "sweep", "METHOD=leaderbot", "ARGS=seed=0,1", "JOBS=2").stdout
    assert "-m train -m experiment=leaderbot seed=0,1" in plain and "joblib" not in plain
    assert "-m train -m experiment=leaderbot launcher=joblib hydra.launcher.n_jobs=2 seed=0,1" in two


def test_the_joblib_launcher_gives_each_job_one_thread(tmp_path):
    # sgm_lipschitz leaves num_threads to torch (null): the launcher sets one thread per job
    assert compose_train(["experiment=sgm_lipschitz"], tmp_path).num_threads is None
    cfg = compose_train(["experiment=sgm_lipschitz", "launcher=joblib", "hydra.launcher.n_jobs=2"], tmp_path)
    assert cfg.num_threads == 1


@pytest.mark.slow
def test_optuna_search_as_the_readme_shows_it(tmp_path):
    args = f"ARGS=hparams_search=leaderbot hydra.sweeper.n_trials=3 debug=limit logger=csv paths.log_dir={tmp_path}"
    proc = _make("sweep", "METHOD=leaderbot", args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = _one("debug/leaderbot/multiruns/*", tmp_path)
    rows = _history(sweep)
    assert [r["number"] for r in rows] == ["0", "1", "2"] and {r["state"] for r in rows} == {"COMPLETE"}
    for row in rows:  # each trial's value is its run's own val/nll, with the parameters the run was given
        run = Path(row["run_dir"])
        assert run == sweep / row["number"]
        assert float(row["value"]) == json.loads((run / "metrics.json").read_text())["val/nll"]
        model = yaml.safe_load((run / "config.yaml").read_text())["model"]
        assert [model["kind"], model["k_cov"], model["k_tie"]] == [
            yaml.safe_load(row[f"params.model.{k}"]) for k in ("kind", "k_cov", "k_tie")
        ]
        assert _one("checkpoints/epoch_*-val_nll_*.ckpt", run)  # the best-validation checkpoint, named by val/nll
    best = min(rows, key=lambda r: float(r["value"]))
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())  # the sweeper's own
    assert results["best_value"] == pytest.approx(float(best["value"]), rel=1e-12)
    assert results["best_params"] == {k[7:]: yaml.safe_load(v) for k, v in best.items() if k.startswith("params.")}
    summary = json.loads((sweep / "optimization_history.json").read_text())
    assert summary["objective"] == "val/nll" and summary["direction"] == "minimize"
    assert summary["best"]["number"] == int(best["number"]) and len(summary["trials"]) == 3


def _fixture_search(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    args = ["train", FIXTURE_CONF, "experiment=spine_fixture", "hparams_search=spine_fixture", "logger=csv"]
    return run_cli([*args, f"paths.log_dir={tmp_path}", *extra])


@pytest.mark.slow
def test_a_failed_trial_is_recorded_and_the_study_goes_on(tmp_path):
    proc = _fixture_search(tmp_path)  # nan_at_step drawn 2, -1, 2: trials 0 and 2 diverge
    assert proc.returncode == 0, proc.stderr[-3000:]
    failed = "trial failed: training loss became nan at global step 2"
    assert proc.stderr.count(failed) == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    sweep = _one("train/spine_fixture/multiruns/*", tmp_path)
    rows = _history(sweep)
    assert [(r["state"], r["params.model.nan_at_step"]) for r in rows] == [
        ("FAIL", "2"),
        ("COMPLETE", "-1"),
        ("FAIL", "2"),
    ]
    assert rows[0]["value"] == "" and rows[0]["error"].startswith("training loss became nan")
    results = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert results["best_params"] == {"model.nan_at_step": -1}
    assert results["best_value"] == pytest.approx(float(rows[1]["value"]), rel=1e-12)


@pytest.mark.slow
def test_a_study_whose_every_trial_failed_ends_in_one_line(tmp_path):
    proc = _fixture_search(tmp_path, "model.nan_at_step=2", "hydra.sweeper.n_trials=2")
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: hparams_search: no trial completed (each failed: see the 'trial failed:' lines)"]
    trials = [line for line in proc.stderr.splitlines() if line.startswith("trial failed:")]
    assert len(trials) == 2 and "Traceback" not in proc.stderr
    assert [r["state"] for r in _history(_one("train/spine_fixture/multiruns/*", tmp_path))] == ["FAIL", "FAIL"]


def _interval(run: Path) -> tuple[float, float]:
    """When a job started (Hydra wrote its .hydra/ folder) and ended (its finished.json)."""
    return (run / ".hydra" / "config.yaml").stat().st_mtime, (run / "finished.json").stat().st_mtime


@pytest.mark.slow
def test_two_jobs_run_at_once_on_one_thread_each_as_the_readme_shows_it(tmp_path):
    proc = _make(
        "sweep", "METHOD=leaderbot", f"ARGS=seed=0,1 debug=limit logger=csv paths.log_dir={tmp_path}", "JOBS=2"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Joblib.Parallel(n_jobs=2" in proc.stdout + proc.stderr
    sweep = _one("debug/leaderbot/multiruns/*", tmp_path)
    runs = [sweep / "0", sweep / "1"]
    configs = [yaml.safe_load((r / "config.yaml").read_text()) for r in runs]
    assert [c["seed"] for c in configs] == [0, 1] and [c["num_threads"] for c in configs] == [1, 1]
    (start0, end0), (start1, end1) = (_interval(r) for r in runs)
    assert start0 < end1 and start1 < end0, "the two jobs did not overlap: they ran one after the other"
