"""`test_weights=best`: the test scores the best-validation checkpoint of the fit (early-stopping-style model
selection), names the step it came from, and refuses configurations that cannot select one."""

from __future__ import annotations

import csv
import json

import pytest

from core.checkpoint import load_checkpoint
from core.errors import ConfigError
from suite.run import train
from tests.conftest import FIXTURE_CONF, compose_train, run_cli, run_entry

BASE = [FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", "trainer.max_epochs=4"]


def _val_curve(run) -> list[tuple[int, float]]:
    with open(run / "csv" / "metrics.csv") as f:
        return [(int(r["step"]), float(r["val/loss"])) for r in csv.DictReader(f) if r.get("val/loss")]


def _train_best(run, mode: str) -> dict[str, float]:
    monitor = ["callbacks.model_checkpoint.monitor=val/loss", f"callbacks.model_checkpoint.mode={mode}"]
    return train(compose_train([*BASE, "test_weights=best", *monitor], run))


def test_best_weights_are_the_selected_checkpoint_not_the_final_model(tmp_path):
    # mode=max selects the *worst* validation loss: the first epoch's on this steadily improving fixture, so the
    # selected weights differ from the final ones and the test must see them.
    final = train(compose_train(BASE, tmp_path / "final"))
    best = _train_best(tmp_path / "best", "max")
    curve = _val_curve(tmp_path / "best")
    assert len(curve) == 4 and curve[0][1] > curve[-1][1]  # the fixture improves, so max != final
    worst_step, worst = max(curve, key=lambda sv: sv[1])
    assert best["test/weights_step"] == worst_step + 1  # the checkpoint after that validation (global step)
    assert best["test/weights_val"] == pytest.approx(worst, rel=1e-6)  # its own validation loss, not the final one
    assert best["val/loss"] == pytest.approx(curve[-1][1], rel=1e-6)
    saved = list((tmp_path / "best" / "checkpoints").glob("epoch_*.ckpt"))
    assert len(saved) == 1 and load_checkpoint(str(saved[0]))["global_step"] == best["test/weights_step"]
    assert best["test/mse"] != pytest.approx(final["test/mse"], rel=1e-3)
    # the same weights tested on their own (`make eval CKPT=...`) give the same test metrics
    assert run_entry("evaluate", [f"ckpt_path={saved[0]}", f"hydra.run.dir={tmp_path / 'eval'}"]) == 0  # in-process
    evaluated = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert evaluated["test/mse"] == pytest.approx(best["test/mse"], rel=1e-6)


def test_best_weights_with_min_mode_and_final_default(tmp_path):
    best = _train_best(tmp_path / "best", "min")
    curve = _val_curve(tmp_path / "best")
    step, lowest = min(curve, key=lambda sv: sv[1])
    assert best["test/weights_step"] == step + 1 and best["test/weights_val"] == pytest.approx(lowest, rel=1e-6)
    final = train(compose_train(BASE, tmp_path / "final"))
    assert "test/weights_step" not in final and "test/weights_val" not in final


def test_best_weights_errors_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"test_weights=last: expected final or best"):
        train(compose_train([*BASE, "test_weights=last"], tmp_path / "a"))
    with pytest.raises(ConfigError, match=r"test_weights=best needs a checkpoint callback that monitors"):
        train(compose_train([*BASE, "test_weights=best"], tmp_path / "b"))
    proc = run_cli(
        ["train", *BASE, "test_weights=best", "callbacks.model_checkpoint=null", f"hydra.run.dir={tmp_path / 'c'}"]
    )
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "callbacks.model_checkpoint.monitor=val/<metric>" in errors[0], proc.stderr[-2000:]
