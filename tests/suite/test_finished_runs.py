"""A finished run is read-only to ``ckpt_path=last``; Ctrl-C stops a run as SIGTERM does (checkpoint, resume hint,
exit 130); resuming picks the interrupted run, never a finished one; a larger budget still extends a finished run;
a SLURM job of a finished run ends at once with status 0."""

from __future__ import annotations

import pytest
import torch

from suite.finished import MARKER, extends
from tests.conftest import FIXTURE_CONF, run_cli, run_entry

KILL = ["+callbacks.kill._target_=tests.fixtures.tiny.SigintAtStep", "+callbacks.kill.step=13"]


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_ctrl_c_then_resume_never_touches_a_finished_run(tmp_path, capsys, monkeypatch):
    logs = tmp_path / "logs"
    args = [FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", f"paths.log_dir={logs}", *KILL]
    runs = logs / "train" / "spine_fixture" / "runs"

    # Ctrl-C at step 13: checkpoint at that batch, the resume hint, exit 130 (SigintAtStep fires only with
    # SUITE_TEST_SIGINT set, so the runs below are the same configuration).
    cut = run_cli(["train", *args], env={"SUITE_TEST_SIGINT": "1"})
    assert cut.returncode == 130, cut.stderr[-3000:]
    (run,) = runs.iterdir()
    last = run / "checkpoints" / "last.ckpt"
    lines = [line for line in cut.stderr.splitlines() if line.startswith(("interrupted:", "resume"))]
    assert lines[0] == f"interrupted: stopped by SIGINT (Ctrl-C) at global step 13 (epoch 1); wrote {last}", lines
    assert lines[1].startswith("resume (continues in the same run folder): make train METHOD=spine_fixture ")
    assert "graceful shutdown" not in cut.stdout + cut.stderr and "Traceback" not in cut.stderr
    assert torch.load(last, weights_only=True)["global_step"] == 13
    assert not (run / MARKER).exists() and not (run / "metrics.json").exists()

    # A newer run of the same configuration that finished.
    __import__("time").sleep(1.1)  # run folders are named by the second they start in
    assert run_entry("train", args) == 0
    (finished,) = set(runs.iterdir()) - {run}
    assert (finished / MARKER).is_file()
    finished_metrics = (finished / "metrics.json").read_bytes()
    capsys.readouterr()

    # `ckpt_path=last` resumes the interrupted run, not the newer finished one, and leaves that one alone.
    assert run_entry("train", [*args, "ckpt_path=last"]) == 0
    assert f"note: ckpt_path=last: resuming {last} in its own folder" in capsys.readouterr().err
    assert torch.load(last, weights_only=True)["global_step"] == 24 and (run / MARKER).is_file()
    assert (finished / "metrics.json").read_bytes() == finished_metrics
    resumed_metrics = (run / "metrics.json").read_bytes()

    # Both runs finished: `ckpt_path=last` refuses in one line and says how to extend; nothing is written.
    stamp = last.stat().st_mtime_ns
    assert run_entry("train", [*args, "ckpt_path=last"]) == 2
    err = capsys.readouterr().err
    assert _errors(err) == [
        f"error: ckpt_path=last: {run} finished (global step 24, epoch 3; {MARKER}) and a finished run is never "
        "resumed; to train it longer extend its budget: trainer.max_epochs=<more than 3> ckpt_path=last; for a new "
        "run drop ckpt_path=last"
    ], err
    # The same with the folder named (the printed resume command's form).
    assert run_entry("train", [*args, "ckpt_path=last", f"hydra.run.dir={run}"]) == 2
    assert len(_errors(capsys.readouterr().err)) == 1
    assert sorted(runs.iterdir()) == sorted([finished, run])
    assert (run / "metrics.json").read_bytes() == resumed_metrics and last.stat().st_mtime_ns == stamp
    assert (finished / "metrics.json").read_bytes() == finished_metrics

    # A requeued SLURM job of a finished run (always `ckpt_path=last`): nothing to do, status 0 at once.
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert run_entry("train", [*args, "ckpt_path=last", f"hydra.run.dir={run}"]) == 0
    assert "already finished" in capsys.readouterr().out
    assert (run / "metrics.json").read_bytes() == resumed_metrics and last.stat().st_mtime_ns == stamp
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.delenv("SLURM_RESTART_COUNT")

    # A larger budget extends the newest finished run (the resumed one) in its folder; its old metrics.json
    # is kept aside.
    assert run_entry("train", [*args, "trainer.max_epochs=4", "ckpt_path=last"]) == 0
    assert f"note: ckpt_path=last: extending {run} from the experiment's budget" in capsys.readouterr().err
    assert torch.load(last, weights_only=True)["global_step"] == 32
    assert (run / "metrics.step24.json").read_bytes() == resumed_metrics and (run / MARKER).is_file()
    assert (finished / "metrics.json").read_bytes() == finished_metrics


@pytest.mark.parametrize(
    ("max_epochs", "max_steps", "more"),
    [
        (3, -1, False),
        (4, -1, True),
        (2, -1, False),
        (None, 24, False),
        (None, 30, True),
        (10, 24, False),
        (-1, -1, True),
        (None, -1, True),
    ],
)
def test_a_budget_extends_a_finished_run_only_when_it_trains_further(max_epochs, max_steps, more):
    assert extends({"global_step": 24, "epoch": 3}, max_epochs, max_steps) is more
