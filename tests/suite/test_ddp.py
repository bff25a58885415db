"""A 2-process CPU DDP run (gloo) ends where a 1-process run at the same global batch ends."""

from __future__ import annotations

import json

import pytest

from tests.conftest import FIXTURE_CONF, run_cli


def _final(tmp_path, name: str, *extra: str) -> dict:
    out = tmp_path / name
    proc = run_cli(
        [
            "train",
            FIXTURE_CONF,
            "experiment=spine_fixture",
            "logger=csv",
            "trainer.max_epochs=2",
            f"hydra.run.dir={out}",
            *extra,
        ],
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.slow
def test_ddp_two_processes_match_one_process(tmp_path):
    # Global batch 8 either way: 1 x 8 or 2 ranks x 4 (datamodules/_base.py splits it); the ranks' shards of each
    # global batch are the same 8 examples, and DDP averages the two per-rank mean gradients.
    single = _final(tmp_path, "single", "trainer=cpu")
    ddp = _final(tmp_path, "ddp", "trainer=ddp_cpu")
    for key in ("val/loss", "test/mse"):
        # Tolerance: float32 sums in a different order (gloo all-reduce), after 16 SGD steps.
        assert ddp[key] == pytest.approx(single[key], rel=1e-5), key
    assert single["val/loss"] < 5.0  # it trained (initial MSE is ~30)


@pytest.mark.slow
def test_a_data_error_in_the_ranks_of_a_ddp_run_leaves_no_run_folder(tmp_path):
    """Each rank reads its data inside fit, after the launching process wrote the run's config and the CSV logger's
    first file: a missing data folder there used to leave that folder behind, counted by `make compare`."""
    missing = tmp_path / "no_such_data"
    logs = tmp_path / "logs"
    proc = run_cli(
        [
            "train",
            "experiment=badloss",
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "data.source=real",
            f"data.data_dir={missing}",
            "logger=csv",
            "debug=fdr",
            f"paths.log_dir={logs}",
        ],
        timeout=600,
    )
    errors = {line for line in proc.stderr.splitlines() if line.startswith("error:")}
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
    assert str(missing) in errors.pop() and "Traceback" not in proc.stderr
    assert not logs.exists() or not any(logs.rglob("*")), sorted(map(str, logs.rglob("*")))
