"""The startup watch (suite/startup.py): markers written by a task failing before the process group forms, and the
other tasks ending on them. The real 2-task SLURM job is in test_slurm.py."""

from __future__ import annotations

import time

import pytest

from suite.errors import ConfigError
from suite.startup import StartupWatch, slurm_task

LAUNCH = "77.0.0"


def _until(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


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
    with pytest.raises(ConfigError), StartupWatch(tmp_path, task=(LAUNCH, 0), group_formed=lambda: False):
        raise ConfigError("data.root=/nope: no such folder\nsecond line")
    marker = tmp_path / f".startup_failed.{LAUNCH}.rank0"
    assert marker.read_text() == "data.root=/nope: no such folder\n"  # suite errors: their one line

    ended: list[str] = []
    with StartupWatch(tmp_path, poll_s=0.01, task=(LAUNCH, 1), group_formed=lambda: False, end=ended.append) as w:
        w.arm(world_size=2)
        assert _until(lambda: ended)
    assert ended == [
        "error: rank 1: rank 0 failed before the process group formed (data.root=/nope: no such folder); "
        "ending this rank instead of waiting for it (its log has the details)"
    ]
    assert not (tmp_path / f".startup_failed.{LAUNCH}.rank1").exists()  # the ended rank raised nothing


def test_other_errors_carry_their_type(tmp_path):
    with pytest.raises(RuntimeError), StartupWatch(tmp_path, task=(LAUNCH, 3), group_formed=lambda: False):
        raise RuntimeError("CUDA out of memory")
    assert (tmp_path / f".startup_failed.{LAUNCH}.rank3").read_text() == "RuntimeError: CUDA out of memory\n"


def test_nothing_is_watched_or_written_once_the_group_formed(tmp_path):
    formed = {"now": False}
    ended: list[str] = []
    watch = StartupWatch(tmp_path, poll_s=0.01, task=(LAUNCH, 0), group_formed=lambda: formed["now"], end=ended.append)
    with pytest.raises(RuntimeError), watch:
        watch.arm(world_size=2)
        formed["now"] = True
        assert _until(lambda: watch.formed)
        formed["now"] = False  # released at the end of a run: the watch remembers it had formed
        (tmp_path / f".startup_failed.{LAUNCH}.rank1").write_text("late\n")  # another rank failing mid-training
        time.sleep(0.05)
        raise RuntimeError("a failure during training")
    assert ended == []  # mid-training failures are not startup failures: no ending, no marker
    assert not (tmp_path / f".startup_failed.{LAUNCH}.rank0").exists()


def test_stale_or_own_markers_and_single_process_runs_are_ignored(tmp_path):
    (tmp_path / ".startup_failed.77.0.0.rank1").write_text("first attempt\n")  # before a requeue
    (tmp_path / ".startup_failed.77.0.1.rank0").write_text("own\n")
    ended: list[str] = []
    watch = StartupWatch(tmp_path, poll_s=0.01, task=("77.0.1", 0), group_formed=lambda: False, end=ended.append)
    with watch:
        watch.arm(world_size=2)
        time.sleep(0.1)
    assert ended == [] and watch.failed_ranks() == {}
    with pytest.raises(ValueError), StartupWatch(tmp_path, task=None) as lone:  # not a SLURM task: no thread, no file
        lone.arm(world_size=2)
        assert lone._thread is None
        raise ValueError("x")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [".startup_failed.77.0.0.rank1", ".startup_failed.77.0.1.rank0"]
    single = StartupWatch(tmp_path, task=(LAUNCH, 0))
    single.arm(world_size=1)  # srun'ed single-process runs: independent, nobody to end
    assert single._thread is None
