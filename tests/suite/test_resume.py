"""A run stopped by SIGTERM mid-epoch and resumed with ckpt_path=last ends exactly like an uninterrupted run, in the
same run folder, with one continuous curve; the SIGTERM'd run says what it wrote and how to resume, and exits 143."""

from __future__ import annotations

import csv
import json
import shlex

import pytest
import torch

from core.errors import PREEMPTED_EXIT_CODE
from tests.conftest import FIXTURE_CONF, ROOT, run_cli, run_entry

COMMON = [FIXTURE_CONF, "experiment=spine_fixture", "logger=csv", "trainer.max_epochs=3"]


@pytest.mark.slow
def test_sigterm_mid_epoch_then_resume_matches_uninterrupted(tmp_path):
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    full = run_cli(["train", *COMMON, f"hydra.run.dir={full_dir}"])
    assert full.returncode == 0, full.stderr[-3000:]

    # 8 batches per epoch: step 13 is batch 5 of epoch 1, i.e. mid-epoch.
    cut = run_cli(
        [
            "train",
            *COMMON,
            f"hydra.run.dir={cut_dir}",
            "+callbacks.kill._target_=tests.fixtures.tiny.SigtermAtStep",
            "+callbacks.kill.step=13",
        ]
    )
    assert cut.returncode != 0 or not (cut_dir / "metrics.json").exists()
    state = torch.load(cut_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["global_step"] == 13 and state["epoch"] == 1

    resumed = run_cli(["train", *COMMON, f"hydra.run.dir={cut_dir}", "ckpt_path=last"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = json.loads((full_dir / "metrics.json").read_text())
    b = json.loads((cut_dir / "metrics.json").read_text())
    for key in ("val/loss", "test/mse", "test/r2"):
        assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), key
    final = torch.load(cut_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert final["global_step"] == 24


def test_a_fresh_run_in_a_reused_folder_keeps_only_its_own_curve(tmp_path):
    """A claim entry rerun (`suite.claim --only`) starts from scratch in the folder of its previous run: the csv
    curve must be the new run's alone, not the old rows followed by the new ones. (Both runs through the train entry
    point in this process: what is tested is the folder's CSV, not a process boundary.)"""
    run = tmp_path / "run"
    for epochs in (2, 1):
        code = run_entry(
            "train",
            [
                FIXTURE_CONF,
                "experiment=spine_fixture",
                "logger=csv",
                f"trainer.max_epochs={epochs}",
                f"hydra.run.dir={run}",
            ],
        )
        assert code == 0
    with (run / "csv" / "metrics.csv").open() as fh:
        val = [int(r["epoch"]) for r in csv.DictReader(fh) if r.get("val/loss")]
    assert val == [0]  # the 1-epoch rerun's single validation, none of the 2-epoch run's


def test_last_never_picks_another_configurations_checkpoint(tmp_path):
    from suite.resume import resolve_checkpoint

    for name, overrides in (("a", ["experiment=x", "model.lr=1"]), ("b", ["experiment=x", "model.lr=2"])):
        run = tmp_path / "runs" / name
        (run / "checkpoints").mkdir(parents=True)
        (run / "checkpoints" / "last.ckpt").write_bytes(b"x")
        (run / ".hydra").mkdir()
        (run / ".hydra" / "overrides.yaml").write_text("\n".join(f"- {o}" for o in overrides))
    new = tmp_path / "runs" / "new"
    found = resolve_checkpoint("last", new, tmp_path, ["experiment=x", "model.lr=1", "ckpt_path=last"])
    assert found == str(tmp_path / "runs" / "a" / "checkpoints" / "last.ckpt")
    assert resolve_checkpoint("last", new, tmp_path, ["experiment=x", "model.lr=3", "ckpt_path=last"]) is None


@pytest.mark.slow
def test_sigterm_message_exit_status_and_resume_in_the_same_folder(tmp_path, capsys):
    """As a user types it: no hydra.run.dir; `ckpt_path=last` must continue in the interrupted run's folder.
    The SIGTERM'd run is a subprocess; the later commands run through the same entry point in this process."""
    logs = tmp_path / "logs"
    kill = ["+callbacks.kill._target_=tests.fixtures.tiny.SigtermAtStep", "+callbacks.kill.step=13"]
    args = [FIXTURE_CONF, "experiment=spine_fixture", f"paths.log_dir={logs}", *kill]  # wandb (offline) + CSV
    cut = run_cli(["train", *args])
    assert cut.returncode == PREEMPTED_EXIT_CODE == 143, cut.stderr[-3000:]
    (run,) = (logs / "train" / "spine_fixture" / "runs").iterdir()
    last = run / "checkpoints" / "last.ckpt"
    lines = [line for line in cut.stderr.splitlines() if line.startswith(("interrupted:", "resume"))]
    assert lines[0] == f"interrupted: stopped by SIGTERM at global step 13 (epoch 1); wrote {last}", lines
    assert lines[1].startswith("resume (continues in the same run folder): make train METHOD=spine_fixture "), lines
    assert "weights_only" not in cut.stdout + cut.stderr and "Received SIGTERM" not in cut.stderr
    assert not (run / "metrics.json").exists()  # an interrupted run never looks finished

    # The printed command resumes exactly (same folder, named by it); plain `ckpt_path=last` finds it as well.
    printed = shlex.split(lines[1].split(": ", 1)[1])
    assert printed[:3] == ["make", "train", "METHOD=spine_fixture"] and printed[3].startswith("ARGS=")
    assert f"hydra.run.dir={run}" in shlex.split(printed[3].removeprefix("ARGS=").replace("$$", "$"))
    assert run_entry("train", [*args, "ckpt_path=last"]) == 0
    resumed = capsys.readouterr()
    assert f"note: ckpt_path=last: resuming {last} in its own folder" in resumed.err
    assert list((logs / "train" / "spine_fixture" / "runs").iterdir()) == [run]  # no second folder
    assert f"run finished: {run}/" in resumed.out and f"checkpoint: {last}" in resumed.out
    assert torch.load(last, weights_only=True)["global_step"] == 24
    with (run / "csv" / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    train_steps = [int(r["step"]) for r in rows if r.get("train/loss_step")]
    assert train_steps == list(range(24)), train_steps  # one curve: every step once, none lost or repeated
    assert [int(r["epoch"]) for r in rows if r.get("val/loss")] == [0, 1, 2]
    ids = {p.name.rsplit("-", 1)[-1] for p in (run / "wandb").glob("offline-run-*")}
    assert len(ids) == 1, ids  # both wandb parts carry one run id: `wandb sync` shows one run

    # Extending the finished run's budget resumes it (and says so) instead of silently starting from scratch.
    assert run_entry("train", [*args, "trainer.max_epochs=4", "ckpt_path=last"]) == 0
    longer = capsys.readouterr()
    assert f"note: ckpt_path=last: extending {run} from the experiment's budget to trainer.max_epochs=4" in longer.err
    assert torch.load(last, weights_only=True)["global_step"] == 32
    assert list((logs / "train" / "spine_fixture" / "runs").iterdir()) == [run]

    # Another configuration never resumes these weights: a new run, and the note says why.
    assert run_entry("train", [*args, "model.optimizer.lr=0.01", "trainer.max_epochs=1", "ckpt_path=last"]) == 0
    other = capsys.readouterr().err
    assert "no run under" in other and "was started with these overrides; starting a new run" in other
    assert len(list((logs / "train" / "spine_fixture" / "runs").iterdir())) == 2


def test_printed_resume_command_is_the_make_form_that_reaches_the_entry_point_unchanged(tmp_path):
    """The resume hint is `make train METHOD=... ARGS=...` (a bare `python -m train` fails outside the venv); what
    make and the shell hand to `python -m train` is exactly the run's overrides (quotes, spaces and `${...}` kept)."""
    import subprocess

    from suite.summary import resume_command

    overrides = [
        "experiment=grass",
        "model.optimizer.lr=0.001",
        "model.scheduler.max_lr=${model.optimizer.lr}",
        "model.net.mixer=[{kind: gated_deltanet, num_heads: 2}]",
        f"paths.log_dir={tmp_path}",
    ]
    cmd = resume_command(overrides, tmp_path / "run")
    assert cmd.startswith("make train METHOD=grass ARGS=")
    dry = subprocess.run(
        ["make", "-n", "--no-print-directory", *shlex.split(cmd)[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert dry.returncode == 0, dry.stderr
    line = next(x for x in dry.stdout.splitlines() if " -m train " in x)
    received = shlex.split(line)[3:]
    assert received == ["experiment=grass", *overrides[1:], "ckpt_path=last", f"hydra.run.dir={tmp_path / 'run'}"]
