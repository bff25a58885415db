"""Everything a shared callback keeps goes into the checkpoint: a run stopped by SIGTERM and resumed ends with the
same method metrics as an uninterrupted run.

Audit of ``callbacks/`` (what each keeps across training steps): ``OutlierCensus`` keeps its probe batch (the first
training batch), its census history and the step of its last census (in the checkpoint: ``state_dict``);
``LossDynamics`` keeps its loss trajectories (in the checkpoint); ``StepTimer`` keeps wall-clock intervals, which
describe the process that measured them (a resumed run times its own steps); ``FiniteLossGuard`` keeps the step of
the current batch only; the test-time callbacks (quantization, TTA, x0 quality) start from nothing at
``on_test_start``; ``OnlineDataCollection`` keeps nothing (its counter lives in the datamodule).
"""

from __future__ import annotations

import csv
import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slow

# A tiny systematic_outliers run: 16 steps, a census every 4 (the census callback as the experiment configures it).
TINY = [
    "experiment=systematic_outliers",
    "logger=csv",
    "trainer.max_steps=16",
    "trainer.val_check_interval=8",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "trainer.enable_progress_bar=false",
    "callbacks.outlier_census.every_n_steps=4",
    "data.max_bytes=60000",
]


def _census_rows(run) -> list[tuple]:
    with (run / "csv" / "outlier_census.csv").open() as fh:
        # five significant digits: the resumed run's float sums may differ in the last bits
        return [
            (r["step"], r["kind"], r["name"], r["metric"], r["value"] and f"{float(r['value']):.5g}")
            for r in csv.DictReader(fh)
        ]


def test_outlier_census_resumes_with_the_same_probe_and_history(tmp_path):
    """The probe batch was not in the checkpoint: a resumed run censused its first batch after the resume instead
    (census/act_ratio_max 7.8486 vs 7.7396 uninterrupted)."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    done = run_cli(["train", *TINY, f"hydra.run.dir={full}"])
    assert done.returncode == 0, done.stderr[-3000:]
    kill = ["+callbacks.kill._target_=tests.fixtures.tiny.SigtermAtStep", "+callbacks.kill.step=6"]
    stopped = run_cli(["train", *TINY, *kill, f"hydra.run.dir={cut}"])
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    resumed = run_cli(["train", *TINY, f"hydra.run.dir={cut}", "ckpt_path=last"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = (json.loads((run / "metrics.json").read_text()) for run in (full, cut))
    census = sorted(k for k in a if k.startswith("census/"))
    assert census, sorted(a)
    for key in census:
        assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-7), key
    rows_a, rows_b = _census_rows(full), _census_rows(cut)
    assert len(rows_a) > 4 and rows_b == rows_a  # one history: every census once, none lost, the same values
