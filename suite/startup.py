"""Startup watch for multi-task SLURM runs: a task that fails before training starts ends the other tasks.

Under ``srun`` every task builds its own data, model and trainer, joins the process group, then reads its data
(``setup``), wraps the model and restores any checkpoint. When one task fails in any of that (a file only its node
lacks, an out-of-memory model build, a bad input only its rank sees), the others are already waiting for it, in the
rendezvous or in a collective: NCCL and torch's store wait for the missing rank until the process-group timeout
(Lightning: 30 minutes) or the job's time limit, holding every allocated GPU. srun's kill-on-bad-exit would end them,
but it also ends the other tasks the moment the first one exits on SIGTERM, racing with their preemption checkpoint
(tried and reverted: the requeue test lost its checkpoint), so the suite ends them itself, and only at startup:

- a task whose ``train``/``evaluate`` raises before its first loop started writes a marker file with its one-line
  error into the run folder (shared by all tasks of the job): ``.startup_failed.<job>.<step>.<restart>.rank<r>``;
- every task of a multi-task SLURM run watches for the other tasks' markers from just before ``fit``/``test`` until
  its first loop starts (sanity check, training, validation or test); on one it prints which rank failed and why,
  then ends its process at once (``os._exit(1)``: the main thread is blocked inside a C++ wait and cannot be
  interrupted).

Lightning installs its SIGTERM handling only after that setup, just before the first loop, so SIGTERM, preemption
and requeue behave exactly as before. A requeued job has a new restart count, so a previous attempt's markers are not
read. A task killed outright (SIGKILL, the kernel's OOM killer) writes no marker; then the timeout still applies. The
tasks must share the run folder: ``make slurm`` (the submitit launcher) gives every task of a job the same one; a
hand-written ``srun python -m train`` needs ``hydra.run.dir=...``, or each task stamps its own.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from lightning.pytorch import Callback

MARKER = ".startup_failed"


def slurm_task() -> tuple[str, int] | None:
    """``(launch id, rank)`` when this process is one task of a multi-task SLURM step, else ``None``.

    The launch id (``<job>.<step>.<restart count>``) is the same for every task of one attempt of one job step and
    differs on a requeue."""
    env = os.environ
    try:
        ntasks = int(env.get("SLURM_NTASKS", "1"))
        rank = int(env["SLURM_PROCID"])
    except (KeyError, ValueError):
        return None
    if ntasks < 2 or "SLURM_JOB_ID" not in env:
        return None
    job = env.get("SLURM_ARRAY_JOB_ID", env["SLURM_JOB_ID"]) + "_" + env.get("SLURM_ARRAY_TASK_ID", "")
    return f"{job.rstrip('_')}.{env.get('SLURM_STEP_ID', '0')}.{env.get('SLURM_RESTART_COUNT', '0')}", rank


def _end_process(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    first = text[0] if text else ""
    ours = type(err).__module__.split(".")[0] in ("core", "suite")  # the suite's own errors are written for users
    return first if ours else f"{type(err).__name__}: {first}"


class StartupWatch:
    """Context manager around a run's build, setup and first loop start (see the module docstring).

    ``with StartupWatch(run_dir) as watch: ...build the trainer...; watch.arm(trainer); trainer.fit(...)``: ``arm``
    starts the watch on a multi-task SLURM trainer and adds the callback that ends it when the first loop starts.

    ``task`` and ``end`` default to the SLURM task and ending the process; tests pass their own."""

    def __init__(
        self,
        run_dir: str | Path,
        poll_s: float = 0.5,
        task: tuple[str, int] | None | bool = True,
        end: Callable[[str], None] = _end_process,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.poll_s = poll_s
        self.task = slurm_task() if task is True else (task or None)
        self.end = end
        self.started = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def marker(self, rank: int) -> Path:
        assert self.task is not None
        return self.run_dir / f"{MARKER}.{self.task[0]}.rank{rank}"

    def arm(self, trainer: Any) -> None:
        """Start watching (in a daemon thread) when ``trainer``'s ranks are the tasks of this SLURM step, and add the
        callback that stops the watch when the first loop starts."""
        from lightning.fabric.plugins.environments import SLURMEnvironment

        env = getattr(trainer.strategy, "cluster_environment", None)
        if self.task is None or trainer.world_size < 2 or not isinstance(env, SLURMEnvironment):
            return
        self.start_thread()
        trainer.callbacks.append(_StageStarted(self))

    def start_thread(self) -> None:
        if self._thread is None and not self.started:
            self._thread = threading.Thread(target=self._watch, name="suite-startup-watch", daemon=True)
            self._thread.start()

    def stage_started(self) -> None:
        """The first loop started: from here on a failure is not a startup failure and nothing is watched."""
        self.started = True
        self._stop.set()

    def failed_ranks(self) -> dict[int, str]:
        """The other tasks' startup failures of this attempt: rank -> one-line error."""
        assert self.task is not None
        launch, me = self.task
        out = {}
        for path in self.run_dir.glob(f"{MARKER}.{launch}.rank*"):
            rank = path.name.rsplit(".rank", 1)[1]
            if not rank.isdigit() or int(rank) == me:
                continue
            try:
                why = path.read_text().strip()
            except OSError:
                continue
            out[int(rank)] = why or "no message"
        return out

    def _watch(self) -> None:
        assert self.task is not None
        while not self._stop.wait(self.poll_s):
            failed = self.failed_ranks()
            if failed and not self.started:
                rank, why = min(failed.items())
                self.end(
                    f"error: rank {self.task[1]}: rank {rank} failed before training started ({why}); "
                    f"ending this rank instead of waiting for it (its log has the details)"
                )
                return

    def __enter__(self) -> StartupWatch:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        # SystemExit (Lightning's SIGTERMException, the CLI's exits) and KeyboardInterrupt are not startup failures
        if self.task is None or not isinstance(exc, Exception) or self.started:
            return
        try:  # best effort: never hide the task's own error behind a marker that could not be written
            self.run_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.marker(self.task[1]).with_name(self.marker(self.task[1]).name + ".tmp")
            tmp.write_text(_one_line(exc) + "\n")
            os.replace(tmp, self.marker(self.task[1]))  # whole or absent: a watcher never reads half a message
        except OSError:
            pass


class _StageStarted(Callback):
    """Lightning callback: the first loop of ``fit``/``validate``/``test``/``predict`` ends the startup watch."""

    def __init__(self, watch: StartupWatch) -> None:
        super().__init__()
        self.watch = watch

    def _started(self, *args: Any) -> None:
        self.watch.stage_started()

    on_sanity_check_start = on_train_start = on_validation_start = on_test_start = on_predict_start = _started
