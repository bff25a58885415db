"""The startup watch (suite/startup.py): markers written by a task failing before training starts, and the other
tasks ending on them. Two real processes with a SLURM task environment (no SLURM needed) below; the real 2-task
SLURM job is in test_slurm.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment

from core.errors import ConfigError
from suite.startup import StartupWatch, _StageStarted, slurm_task
from tests.conftest import FIXTURE_CONF, ROOT

LAUNCH = "77.0.0"


def _until(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def _trainer(world_size: int = 2, env: object | None = None) -> SimpleNamespace:
    env = object.__new__(SLURMEnvironment) if env is None else env  # no __init__: it inspects the real environment
    return SimpleNamespace(world_size=world_size, strategy=SimpleNamespace(cluster_environment=env), callbacks=[])


def test_slurm_task_identity(monkeypatch):
    for key in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert slurm_task() is None  # one task: nobody waits for it
    monkeypatch.setenv("SLURM_NTASKS", "2")
    assert slurm_task() == ("77.0.0", 1)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")  # a requeued attempt does not read the first attempt's markers
    monkeypatch.setenv("SLURM_STEP_ID", "2")
    assert slurm_task() == ("77.2.3", 1)
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "70")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "5")
    assert slurm_task() == ("70_5.2.3", 1)
    monkeypatch.delenv("SLURM_PROCID")  # salloc without srun: not a task
    assert slurm_task() is None


def test_a_failing_task_writes_its_error_and_the_waiting_task_ends(tmp_path):
    with pytest.raises(ConfigError), StartupWatch(tmp_path, task=(LAUNCH, 0)):
        raise ConfigError("data.root=/nope: no such folder\nsecond line")
    marker = tmp_path / f".startup_failed.{LAUNCH}.rank0"
    assert marker.read_text() == "data.root=/nope: no such folder\n"  # suite errors: their one line
    assert sorted(p.name for p in tmp_path.iterdir()) == [marker.name]  # written whole: no temporary left

    ended: list[str] = []
    with StartupWatch(tmp_path, poll_s=0.01, task=(LAUNCH, 1), end=ended.append) as watch:
        trainer = _trainer()
        watch.arm(trainer)
        assert any(isinstance(cb, _StageStarted) for cb in trainer.callbacks)
        assert _until(lambda: ended)
    assert ended == [
        "error: rank 1: rank 0 failed before training started (data.root=/nope: no such folder); "
        "ending this rank instead of waiting for it (its log has the details)"
    ]
    assert not (tmp_path / f".startup_failed.{LAUNCH}.rank1").exists()  # the ended rank raised nothing


def test_other_errors_carry_their_type_and_exits_write_nothing(tmp_path):
    with pytest.raises(RuntimeError), StartupWatch(tmp_path, task=(LAUNCH, 3)):
        raise RuntimeError("CUDA out of memory")
    assert (tmp_path / f".startup_failed.{LAUNCH}.rank3").read_text() == "RuntimeError: CUDA out of memory\n"
    # SystemExit (Lightning's SIGTERMException, the CLI's own exits) and Ctrl-C are not startup failures
    for exc in (SystemExit(2), KeyboardInterrupt()):
        with pytest.raises(type(exc)), StartupWatch(tmp_path, task=(LAUNCH, 4)):
            raise exc
    assert not (tmp_path / f".startup_failed.{LAUNCH}.rank4").exists()


def test_nothing_is_watched_or_written_once_the_first_loop_started(tmp_path):
    ended: list[str] = []
    watch = StartupWatch(tmp_path, poll_s=0.01, task=(LAUNCH, 0), end=ended.append)
    with pytest.raises(RuntimeError), watch:
        trainer = _trainer()
        watch.arm(trainer)
        hook = next(cb for cb in trainer.callbacks if isinstance(cb, _StageStarted))
        hook.on_train_start(None, None)
        assert watch.started and _until(lambda: not watch._thread.is_alive())
        (tmp_path / f".startup_failed.{LAUNCH}.rank1").write_text("late\n")  # another rank failing mid-training
        time.sleep(0.05)
        raise RuntimeError("a failure during training")
    assert ended == []  # mid-training failures are not startup failures: no ending, no marker
    assert not (tmp_path / f".startup_failed.{LAUNCH}.rank0").exists()


def test_stale_own_partial_markers_and_other_runs_are_ignored(tmp_path):
    (tmp_path / ".startup_failed.77.0.0.rank1").write_text("first attempt\n")  # before a requeue
    (tmp_path / ".startup_failed.77.0.1.rank0").write_text("own\n")
    (tmp_path / ".startup_failed.77.0.1.rank1.tmp").write_text("being writ")  # not yet renamed
    ended: list[str] = []
    watch = StartupWatch(tmp_path, poll_s=0.01, task=("77.0.1", 0), end=ended.append)
    with watch:
        watch.arm(_trainer())
        time.sleep(0.1)
    assert ended == [] and watch.failed_ranks() == {}
    (tmp_path / ".startup_failed.77.0.1.rank2").write_text("")
    assert watch.failed_ranks() == {2: "no message"}
    for task, trainer in (
        (None, _trainer()),  # not a SLURM task
        ((LAUNCH, 0), _trainer(world_size=1)),  # srun'ed independent single-process runs
        ((LAUNCH, 0), _trainer(env=LightningEnvironment())),  # Lightning spawned the ranks itself
    ):
        lone = StartupWatch(tmp_path, task=task)
        lone.arm(trainer)
        assert lone._thread is None and trainer.callbacks == []


def test_the_first_loop_of_a_real_fit_ends_the_watch(tmp_path):
    import lightning.pytorch as pl

    from tests.fixtures.tiny import TinyDataModule, TinyLitModule

    watch = StartupWatch(tmp_path, task=(LAUNCH, 0), end=lambda msg: pytest.fail(msg))
    watch.start_thread()
    seen = []

    class Probe(pl.Callback):
        def on_train_batch_start(self, *args):
            seen.append(watch.started)

    trainer = pl.Trainer(
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[_StageStarted(watch), Probe()],
        num_sanity_val_steps=0,
    )
    assert not watch.started
    with watch:
        trainer.fit(TinyLitModule(), datamodule=TinyDataModule())
    assert seen == [True, True]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("failing", [0, 1])
def test_two_slurm_tasks_one_failing_at_startup(tmp_path, failing):
    """Two ``python -m train`` processes with the environment srun gives two tasks (Lightning's SLURMEnvironment):
    the failing one raises in the model constructor; the other, waiting in the rendezvous (as the store's client
    when rank 0 fails, as its server when rank 1 does), ends within seconds naming the failure instead of waiting
    for the 30-minute timeout."""
    port = str(_free_port())
    procs = []
    for rank in (0, 1):
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "WANDB_MODE": "offline",
            "SLURM_NTASKS": "2",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NODEID": "0",
            "SLURM_NNODES": "1",
            "SLURM_NTASKS_PER_NODE": "2",
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NAME": "suite-test",
            "SLURM_NODELIST": "127.0.0.1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        env.pop("HYDRA_FULL_ERROR", None)
        cmd = [
            sys.executable,
            "-m",
            "train",
            FIXTURE_CONF,
            "experiment=spine_fixture",
            "logger=csv",
            "trainer=ddp_cpu",
            "trainer.enable_progress_bar=false",
            f"hydra.run.dir={tmp_path / 'run'}",
            f"model.fail_on_rank={failing}",
        ]
        procs.append(
            subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    start = time.monotonic()
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=240))
    finally:
        for p in procs:
            p.kill()
    took = time.monotonic() - start
    waiting = 1 - failing
    assert procs[failing].returncode == 2, outs[failing][1][-2000:]  # the CLI's one-line error
    assert f"fixture failure on rank {failing}" in outs[failing][1]
    assert procs[waiting].returncode == 1, outs[waiting][1][-2000:]
    assert (
        f"error: rank {waiting}: rank {failing} failed before training started "
        f"(model: RuntimeError: fixture failure on rank {failing} (model.fail_on_rank))"
    ) in outs[waiting][1]
    assert took < 120, took
