"""Startup watch for multi-task SLURM runs: a task that fails before the DDP process group forms ends the others.

Under ``srun`` every task builds its own data, model and trainer, then joins the process group. When one task fails
before that (a file only its node lacks, an out-of-memory model build, a bad input only its rank sees), the others
are already waiting in the rendezvous: torch's store waits for the missing rank until the process-group timeout
(Lightning: 30 minutes) or the job's time limit, holding every allocated GPU. srun's kill-on-bad-exit would end them,
but it also ends the other tasks the moment the first one exits on SIGTERM, racing with their preemption checkpoint
(tried and reverted: the requeue test lost its checkpoint), so the suite ends them itself, and only at startup:

- a task whose ``train``/``evaluate`` raises before the process group formed writes a marker file with its one-line
  error into the run folder (shared by all tasks of the job): ``.startup_failed.<job>.<step>.<restart>.rank<r>``;
- every task of a multi-task run watches for the other tasks' markers from the moment its trainer exists until the
  process group forms; on one it prints which rank failed and why, then ends its process at once (``os._exit(1)``:
  the main thread is blocked inside the store's C++ wait and cannot be interrupted).

Once the group has formed the watch is over: SIGTERM, preemption and requeue behave exactly as before. A requeued job
has a new restart count, so a previous attempt's markers are not read. A task killed outright (SIGKILL, the
kernel's OOM killer) writes no marker; then the process-group timeout still applies.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

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


def _group_formed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _end_process(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    first = text[0] if text else ""
    return first if type(err).__module__.startswith("suite") else f"{type(err).__name__}: {first}"


class StartupWatch:
    """Context manager around a run's build and fit (see the module docstring).

    ``with StartupWatch(run_dir) as watch: ...build the trainer...; watch.arm(trainer.world_size); trainer.fit(...)``

    ``task``, ``group_formed`` and ``end`` default to the SLURM task, ``torch.distributed`` and ending the process;
    tests pass their own."""

    def __init__(
        self,
        run_dir: str | Path,
        poll_s: float = 0.5,
        task: tuple[str, int] | None | bool = True,
        group_formed: Callable[[], bool] = _group_formed,
        end: Callable[[str], None] = _end_process,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.poll_s = poll_s
        self.task = slurm_task() if task is True else (task or None)
        self.group_formed = group_formed
        self.end = end
        self.formed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def marker(self, rank: int) -> Path:
        assert self.task is not None
        return self.run_dir / f"{MARKER}.{self.task[0]}.rank{rank}"

    def arm(self, world_size: int) -> None:
        """Start watching (in a daemon thread) when this run's ranks are separate SLURM tasks."""
        if self.task is None or world_size < 2 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._watch, name="suite-startup-watch", daemon=True)
        self._thread.start()

    def failed_ranks(self) -> dict[int, str]:
        """The other tasks' startup failures of this attempt: rank -> one-line error."""
        assert self.task is not None
        launch, me = self.task
        out = {}
        for path in self.run_dir.glob(f"{MARKER}.{launch}.rank*"):
            rank = path.name.rsplit(".rank", 1)[1]
            if rank.isdigit() and int(rank) != me:
                try:
                    out[int(rank)] = path.read_text().strip()
                except OSError:  # being written: read on the next poll
                    continue
        return out

    def _watch(self) -> None:
        assert self.task is not None
        while not self._stop.wait(self.poll_s):
            if self.group_formed():
                self.formed = True
                return
            failed = self.failed_ranks()
            if failed:
                rank, why = min(failed.items())
                self.end(
                    f"error: rank {self.task[1]}: rank {rank} failed before the process group formed ({why}); "
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
            self._thread.join()
        if self.task is None or not isinstance(exc, Exception) or self.formed or self.group_formed():
            return
        try:  # best effort: never hide the task's own error behind a marker that could not be written
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.marker(self.task[1]).write_text(_one_line(exc) + "\n")
        except OSError:
            pass
