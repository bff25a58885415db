"""Real single-node SLURM: a 2-task DDP run through Hydra's submitit launcher, and a requeue mid-training.

The cluster (munge, MariaDB, slurmdbd, slurmctld and slurmd from Debian packages, installed when running as root and
missing) is the session fixture ``slurm`` of tests/suite/conftest.py: skipped with the reason where it cannot start,
started once per pytest run, and every daemon stopped by PID afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import FIXTURE_CONF, ROOT, run_cli

pytestmark = pytest.mark.slow


def _launch(env: dict, sweep: Path, *overrides: str, local: bool = False) -> subprocess.Popen:
    """The sweep through SLURM, or with ``local`` the same 2-process DDP run without it (Hydra's basic launcher)."""
    full_env = {**os.environ, **env, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline"}
    full_env.pop("HYDRA_FULL_ERROR", None)
    # An in-process DDP test earlier in the session leaves Lightning's MASTER_PORT in os.environ: two DDP runs at once
    # must not both inherit it (without it the SLURM job derives its port from the job id, a local run finds a port).
    for key in ("MASTER_PORT", "MASTER_ADDR"):
        full_env.pop(key, None)
    launcher = [] if local else ["launcher=slurm", "hydra.launcher.mem_gb=1", "hydra.launcher.timeout_min=20"]
    cmd = [
        "python",
        "-m",
        "train",
        "-m",
        *launcher,
        "trainer=ddp_cpu",
        "logger=csv",
        "trainer.enable_progress_bar=false",
        f"hydra.sweep.dir={sweep}",
        *overrides,
    ]
    cmd[0] = str(Path(os.sys.executable))
    return subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _job_id(sweep: Path) -> str:
    ids = [p.name for p in (sweep / ".submitit").iterdir() if p.name.isdigit()]
    assert len(ids) == 1, ids
    return ids[0]


def test_two_task_ddp_run_of_a_real_experiment(slurm, tmp_path):
    # ts_lif's non-spiking GRU baseline (spiking thresholds would turn float reordering into flipped spikes).
    real = ["experiment=ts_lif", "model.backbone=gru_ref", "debug=limit"]
    sweep = tmp_path / "sweep"
    proc = _launch(slurm, sweep, *real)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    metrics = json.loads((sweep / "0" / "metrics.json").read_text())
    job = _job_id(sweep)
    log = (sweep / ".submitit" / job / f"{job}_0_log.out").read_text()
    assert "distributed_backend=gloo" in log
    assert "All distributed processes registered. Starting with 2 processes" in log
    local = run_cli(["train", *real, "trainer=cpu", "logger=csv", f"hydra.run.dir={tmp_path / 'one'}"])
    assert local.returncode == 0, local.stderr[-3000:]
    single = json.loads((tmp_path / "one" / "metrics.json").read_text())
    # Same global batches (ranks get interleaved halves); Adam's early sign-like steps amplify the float32
    # all-reduce rounding to ~5e-5 relative after 6 steps, hence the tolerance.
    for key in ("test/mse", "test/mae"):
        assert metrics[key] == pytest.approx(single[key], rel=1e-3), key


def test_a_task_failing_at_startup_ends_the_job(slurm, tmp_path):
    """Rank 0 fails on a bad input before the process group forms (a one-line error, exit 2) while rank 1 goes on to
    wait for rank 0's rendezvous; without the startup watch (suite/startup.py) rank 1 would wait there for the
    30-minute process-group timeout or the job's time limit. With it rank 1 reads rank 0's marker and ends at once,
    naming rank 0's error, and the job ends FAILED. (Both directions, without SLURM: test_startup_watch.py.)"""
    sweep = tmp_path / "sweep"
    start = time.monotonic()
    proc = _launch(slurm, sweep, FIXTURE_CONF, "experiment=spine_fixture", "model.fail_on_rank=0")
    env = {**os.environ, **slurm}
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        subprocess.run(["scancel", _job_id(sweep)], env=env, timeout=60)  # free the one-node cluster
        pytest.fail("the job was still running 300 s after rank 0 failed")
    took = time.monotonic() - start
    assert proc.returncode != 0, out[-3000:]
    assert "fixture failure on rank 0" in out, out[-3000:]  # the submitting command reports the failed task's error
    job = _job_id(sweep)
    logs = sweep / ".submitit" / job
    assert "fixture failure on rank 0 (model.fail_on_rank)" in (logs / f"{job}_0_log.err").read_text()
    err1 = (logs / f"{job}_1_log.err").read_text()
    assert (
        "error: rank 1: rank 0 failed before training started (model: RuntimeError: fixture failure on rank 0" in err1
    ), err1[-3000:]
    assert took < 150, took  # the 30-minute rendezvous timeout otherwise (submission and sacct polls included)
    deadline = time.monotonic() + 120
    while True:  # slurmctld books the final state shortly after the tasks end
        state = subprocess.run(
            ["sacct", "-j", job, "-X", "-n", "-o", "State"], env=env, capture_output=True, text=True, timeout=60
        ).stdout.split()
        if state[-1:] == ["FAILED"] or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert state[-1:] == ["FAILED"], state
    print(f"startup failure ended the job in {took:.0f} s")


def _trace(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_requeued_job_resumes_from_checkpoint_with_same_metrics(slurm, tmp_path, request):
    """The requeued job must *resume*: a deterministic restart from scratch would give the same final metrics, so
    the fixture's rank-0 trace proves it: the second process starts fitting at the global step of the checkpoint
    the first one saved when SLURM preempted it (> 0), and trains only the remaining steps. The uninterrupted
    reference is the same 2-process DDP run outside SLURM, alongside the job (the one-node cluster runs one 2-task
    job at a time; a second SLURM job doubled this test's time)."""
    common = [FIXTURE_CONF, "experiment=spine_fixture", "trainer.max_epochs=5", "model.sleep_s=0.1"]
    ref = _launch(slurm, tmp_path / "ref", *common, f"model.trace_file={tmp_path / 'ref.jsonl'}", local=True)
    request.addfinalizer(lambda: ref.poll() is None and ref.kill())  # a failed assertion leaves nothing running
    sweep = tmp_path / "requeued"
    trace = tmp_path / "requeued.jsonl"
    proc = _launch(slurm, sweep, *common, f"model.trace_file={trace}")
    ckpt_dir = sweep / "0" / "checkpoints"
    deadline = time.monotonic() + 600
    while not list(ckpt_dir.glob("epoch_*.ckpt")):  # after epoch 0: requeue mid-training
        assert proc.poll() is None and time.monotonic() < deadline, "job ended before it could be requeued"
        time.sleep(0.5)
    job = _job_id(sweep)
    env = {**os.environ, **slurm}
    subprocess.run(["scontrol", "requeue", job], env=env, check=True, timeout=60)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    deadline = time.monotonic() + 120
    while True:  # the result file lands before slurmctld books the job as completed
        states = subprocess.run(
            ["sacct", "-j", job, "-D", "-X", "-n", "-o", "State"], env=env, capture_output=True, text=True, timeout=60
        ).stdout.split()
        if states[-1:] == ["COMPLETED"] or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert "REQUEUED" in states and states[-1] == "COMPLETED", states
    ref_out, _ = ref.communicate(timeout=900)
    assert ref.returncode == 0, ref_out[-3000:]
    full = _trace(tmp_path / "ref.jsonl")
    full_steps = [e["global_step"] for e in full if e["event"] == "step"]
    assert [e["global_step"] for e in full if e["event"] == "start"] == [0]
    assert full_steps == list(range(len(full_steps))) and len(full_steps) >= 10

    events = _trace(trace)
    starts = [i for i, e in enumerate(events) if e["event"] == "start"]
    assert len(starts) == 2, events  # the first run and the requeued one
    first, second = events[: starts[1]], events[starts[1] :]
    assert events[0]["global_step"] == 0 and len({e["pid"] for e in first} & {e["pid"] for e in second}) == 0
    saved = [e["global_step"] for e in first if e["event"] == "save"][-1]  # last.ckpt written at preemption
    trained_before = [e["global_step"] for e in first if e["event"] == "step"]
    if saved != trained_before[-1] + 1:  # no preemption checkpoint: only srun's forced kill may explain it
        # The requeue signals srun too; when its SIGCONT reaches srun while the step is aborting, srun kills the
        # tasks at once ("forcing job termination") before they finish the batch and save. The resume then comes
        # from the last checkpoint on disk (the epoch's), which the assertions below still check.
        errs = "".join(p.read_text() for p in (sweep / ".submitit").glob("*/*_log.err"))
        assert "forcing job termination" in errs, (saved, trained_before, errs[-2000:])
    resumed = second[0]["global_step"]
    assert resumed > 0 and resumed == saved, (resumed, saved)
    trained_after = [e["global_step"] for e in second if e["event"] == "step"]
    assert trained_after == full_steps[resumed:]  # only the remaining steps, continuing the count
    assert len(trained_after) < len(full_steps)
    a = json.loads((tmp_path / "ref" / "0" / "metrics.json").read_text())
    b = json.loads((sweep / "0" / "metrics.json").read_text())
    for key in ("val/loss", "test/mse"):
        assert b[key] == pytest.approx(a[key], rel=1e-6), key
