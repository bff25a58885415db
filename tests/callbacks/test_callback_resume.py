"""Everything a shared callback keeps goes into the checkpoint: a run stopped by SIGTERM and resumed ends with the
same method metrics as an uninterrupted run: the outlier census, and every callback of the registry
(:data:`callbacks.contracts.CONTRACTS`) on an experiment that meets its contract, at debug size.

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
import math
import shlex
from pathlib import Path

import pytest
import torch

from callbacks.contracts import CONTRACTS
from tests.conftest import run_cli, run_entry

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


# -- every callback of the registry ----------------------------------------------------------------------------------
KILL = ["+callbacks.kill._target_=tests.fixtures.tiny.SigtermAtStep"]
QUANT = ["methods=[fp,rtn]", "w_bits=4", "a_bits=4", "kv_bits=4", "steps=0", "calib_batches=1", "eval_batches=1"]


def _callback(key: str, target: str, settings: list[str]) -> list[str]:
    return [f"++callbacks.{key}._target_={target}"] + [f"++callbacks.{key}.{kv}" for kv in settings]


# One debug-size experiment per group of callbacks that meet their contracts on it: the overrides, the step after
# which SIGTERM stops the run (mid-fit, after the first epoch or validation), and per callback the metric prefixes it
# logs (and its files) that must come out of the resumed run as out of the uninterrupted one.
CASES = {
    "badloss": (
        [
            "experiment=badloss",
            "data.subset=256",
            "data.test_subset=64",
            "data.num_probes=8",
            "model.k=4",
            "data.batch_size=32",
            "model.detect_epochs=2",
            "trainer.max_epochs=3",
            "trainer.limit_val_batches=1",
            "trainer.limit_test_batches=2",
            *_callback("tta", "callbacks.tta.TestTimeAdaptation", ["method=tent", "optimizer=adam", "lr=0.01"]),
            *_callback(
                "quant_calibration",
                "callbacks.quant_classifier.ClassifierQuantCalibration",
                ["methods=[fp,rtn]", "w_bits=4", "a_bits=4", "steps=0", "calib_batches=1"],
            ),
        ],
        10,
        {
            "TestTimeAdaptation": ("tta/",),
            "LossDynamics": ("detect/",),  # BaDLoss scores its detection on the recorded loss matrix
            "ClassifierQuantCalibration": ("quant/",),
        },
    ),
    "systematic_outliers": (
        [
            "experiment=systematic_outliers",
            "data.max_bytes=60000",
            "trainer.max_steps=12",
            "trainer.val_check_interval=6",
            "trainer.limit_val_batches=1",
            "trainer.limit_test_batches=1",
            *_callback("quant_calibration", "callbacks.quant_calibration.QuantCalibration", QUANT),
        ],
        8,
        {"QuantCalibration": ("quant/",)},
    ),
    "ostquant_minilm": (
        [
            "experiment=ostquant_minilm",
            "data.max_bytes=60000",
            "trainer.max_steps=8",
            "trainer.val_check_interval=4",
            "trainer.limit_val_batches=1",
            "trainer.limit_test_batches=1",
            *_callback("quant_calibration", "callbacks.quant_calibration.MaskedLMQuantCalibration", QUANT),
        ],
        5,
        {"MaskedLMQuantCalibration": ("quant/",)},
    ),
}


def test_every_callback_of_the_registry_has_a_resume_case():
    covered = sorted(name for _, _, checks in CASES.values() for name in checks)
    assert covered == sorted(c.callback for c in CONTRACTS)


def _train(args: list[str], capsys) -> tuple[int, str]:  # noqa: ANN001
    code = run_entry("train", args)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("slug", sorted(CASES))
def test_a_resumed_run_ends_with_the_callbacks_metrics_of_an_uninterrupted_one(slug, tmp_path, capsys):
    overrides, step, checks = CASES[slug]
    base = [*overrides, "logger=csv", "trainer.enable_progress_bar=false"]
    full, cut = tmp_path / "full", tmp_path / "cut"
    code, err = _train([*base, f"hydra.run.dir={full}"], capsys)
    assert code == 0, err[-3000:]
    code, err = _train([*base, *KILL, f"+callbacks.kill.step={step}", f"hydra.run.dir={cut}"], capsys)
    assert code == 143 and not (cut / "metrics.json").exists(), err[-3000:]
    # the printed command, as the entry point receives it from make (ARGS unquoted, `$$` back to `$`)
    printed = shlex.split(next(line for line in err.splitlines() if line.startswith("resume")).split(": ", 1)[1])
    method = printed[2].removeprefix("METHOD=")
    args = shlex.split(printed[3].removeprefix("ARGS=").replace("$$", "$"))
    resumed = [a for a in args if not a.startswith("+callbacks.kill.")]  # the same run, no second SIGTERM
    code, err = _train([f"experiment={method}", *resumed], capsys)
    assert code == 0, err[-3000:]
    a, b = (json.loads((run / "metrics.json").read_text()) for run in (full, cut))
    for callback, prefixes in checks.items():
        keys = sorted(k for k in a if k.startswith(prefixes) and math.isfinite(a[k]))
        assert keys, f"{callback}: the uninterrupted run logged no {prefixes} metric: {sorted(a)}"
        for key in keys:
            assert b.get(key) == pytest.approx(a[key], rel=1e-5, abs=1e-7), (callback, key)
    if "LossDynamics" in checks:  # the loss matrix itself: every epoch's per-example losses, none lost
        m_a, m_b = (torch.load(Path(run) / "loss_dynamics.pt", weights_only=True) for run in (full, cut))
        assert m_a["epochs"].tolist() == m_b["epochs"].tolist() and len(m_a["epochs"]) >= 2
        torch.testing.assert_close(m_b["values"], m_a["values"], rtol=1e-5, atol=1e-6)
