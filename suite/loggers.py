"""Loggers: a CSV logger that keeps the curve of a resumed run, and wandb that never blocks or fails a run."""

from __future__ import annotations

import atexit
import collections
import functools
import io
import netrc
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.utilities import rank_zero_only

WANDB_ID_FILE = "suite_wandb_run_id"


class ResumableCSVLogger(CSVLogger):
    """Lightning's :class:`CSVLogger`, except that a run resumed in its own folder (``ckpt_path=last``) appends to
    ``metrics.csv`` instead of deleting it, so one folder holds the whole curve.

    Rows logged after the checkpoint the run resumes from are dropped by :func:`truncate_csv` (``suite.run``).

    Lightning's logger connector calls :meth:`save` after every logged step, which rewrote or appended to the file
    each step (a file open and write per step: ~0.3-0.6 ms of a ~6 ms step on a small model). Here the rows are
    written every ``flush_logs_every_n_steps`` (100) saves, at every checkpoint the :class:`ModelCheckpoint` writes
    (so the file always covers the steps a resume starts from), and when fit, validation or test ends or fails
    (Lightning finalizes its loggers then, SIGTERM included): the finished file is the same.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._unsaved = 0

    @rank_zero_only
    def save(self) -> None:
        self._unsaved += 1
        if self._unsaved >= self._flush_logs_every_n_steps:
            self.flush()

    @rank_zero_only
    def flush(self) -> None:
        """Write the buffered rows to ``metrics.csv`` now."""
        self._unsaved = 0
        if self._experiment is not None:
            super().save()

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        self.flush()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        self.flush()

    @property
    def experiment(self) -> Any:
        if self._experiment is not None:
            return self._experiment
        path = Path(self.log_dir) / "metrics.csv"
        old = path.read_text() if path.is_file() else None
        with warnings.catch_warnings():  # "...exists and is not empty. Previous log files ... will be deleted"
            warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty")
            experiment = super().experiment
        if old and rank_zero_only.rank == 0:
            write_atomic(path, old)
            header = old.splitlines()[0].split(",") if old.strip() else []
            experiment.metrics_keys = sorted(k for k in header if k)
        return experiment


def truncate_csv(path: Path, after_step: int) -> int:
    """Drop the rows of ``metrics.csv`` logged at a step > ``after_step`` (a resumed run logs them again);
    returns the number of rows kept."""
    import csv

    if not path.is_file():
        return 0
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        fields, rows = reader.fieldnames or [], list(reader)
    kept = [r for r in rows if not r.get("step") or float(r["step"]) <= after_step]
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    writer.writerows(kept)
    write_atomic(path, buf.getvalue())
    return len(kept)


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path``'s content with ``text`` all at once (a temporary file renamed over it): a process ended
    midway, e.g. by the startup watch, leaves the old file or the new one, never a cut-off run curve."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as fh:
        fh.write(text)
    os.replace(tmp, path)


def wandb_mode(mode: str = "auto") -> str:
    """Resolve the wandb mode: ``online`` only if asked for or the user is logged in, else ``offline``.

    ``WANDB_MODE`` wins when set; ``mode='auto'`` looks for an API key (``WANDB_API_KEY`` or a netrc entry).
    """
    env = os.environ.get("WANDB_MODE")
    if env:
        return env
    if mode != "auto":
        return mode
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        rc = netrc.netrc(os.environ.get("NETRC", str(Path.home() / ".netrc")))
        if rc.authenticators("api.wandb.ai"):
            return "online"
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        pass
    return "offline"


@functools.cache
def _wandb_logger_class() -> type:
    from lightning.pytorch.loggers import WandbLogger

    class AsyncWandbLogger(WandbLogger):
        """:class:`WandbLogger` whose per-step ``log_metrics`` hands the row to one background thread.

        ``wandb.Run.log`` waits for its record to reach the wandb service process, about 0.5 ms per call on an idle
        machine and several under load, twice a step in the suite (the metrics and the learning-rate monitor). Here
        the training thread only queues the row; one thread logs the queued rows in order every ``interval``
        seconds. Every other use of the run (``logger.experiment``: hyper-parameters, summaries, tables,
        ``finish``) first waits until the queue is empty, and so do ``finalize`` and interpreter exit, so the run's
        history is the same as with synchronous logging. A logging error is reported once as a warning and never
        fails the run (the CSV logger still records).
        """

        interval = 0.1  # seconds between the logging thread's passes over the queued rows

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._rows: collections.deque = collections.deque()
            self._queued = 0  # written by the training thread only
            self._done = 0  # written by the logging thread only
            self._wake: threading.Event | None = None
            self._worker: threading.Thread | None = None
            self._log_error: str | None = None

        @property
        def experiment(self) -> Any:
            if threading.current_thread() is not self._worker:
                self.flush()
            return super().experiment

        @rank_zero_only
        def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
            if self._worker is None or not self._worker.is_alive():
                self._wake = threading.Event()
                self._worker = threading.Thread(target=self._drain_rows, name="wandb-log", daemon=True)
                self._worker.start()
                atexit.register(self.flush)
            # No wake-up per row (handing the GIL to a woken thread every step costs more than the log call): the
            # thread drains the queue every `interval` seconds or when flushed.
            self._rows.append((dict(metrics), step))
            self._queued += 1

        def _drain_rows(self) -> None:
            while True:
                self._wake.wait(self.interval)
                self._wake.clear()
                while self._rows:
                    metrics, step = self._rows.popleft()
                    try:
                        WandbLogger.log_metrics(self, metrics, step)
                    except Exception as err:  # noqa: BLE001 - wandb must never fail a run
                        if self._log_error is None:
                            self._log_error = f"{type(err).__name__}: {err}"
                            warnings.warn(
                                f"wandb logging failed ({self._log_error}); CSV logs are still written.", stacklevel=2
                            )
                    finally:
                        self._done += 1

        def flush(self, timeout: float = 120.0) -> None:
            """Wait until every queued row has been logged (at most ``timeout`` seconds)."""
            worker = self._worker
            if worker is None:
                return
            end = time.monotonic() + timeout
            while self._done < self._queued and worker.is_alive() and time.monotonic() < end:
                self._wake.set()
                time.sleep(0.002)

        @rank_zero_only
        def finalize(self, status: str) -> None:
            self.flush()
            super().finalize(status)

        def __getstate__(self) -> dict[str, Any]:
            self.flush()
            state = super().__getstate__()
            state.update(_rows=collections.deque(), _queued=0, _done=0, _wake=None, _worker=None)
            return state

    return AsyncWandbLogger


def make_wandb_logger(
    save_dir: str,
    project: str,
    group: str | None = None,
    name: str | None = None,
    tags: list[str] | None = None,
    mode: str = "auto",
    async_log: bool = True,
    **kwargs: Any,
) -> Logger | None:
    """Build a :class:`WandbLogger`; on any failure warn and return ``None`` (the CSV logger still records).

    Args:
        save_dir: Run folder; wandb writes ``<save_dir>/wandb/offline-run-*/run-*.wandb`` there.
        project: wandb project.
        group: Run group (the paper's slug), so dashboards compare a paper's methods side by side.
        name: Run name.
        tags: Run tags.
        mode: ``auto`` (see :func:`wandb_mode`), ``online``, ``offline`` or ``disabled``.
        async_log: Log each step's metrics from a background thread (``AsyncWandbLogger``); ``False``: Lightning's
            synchronous ``WandbLogger``.
    """
    resolved = wandb_mode(mode)
    if resolved == "disabled":
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    # Offline never touches the network; online failures must not kill a run.
    os.environ.setdefault("WANDB_INIT_TIMEOUT", "30")
    try:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        # A run resumed in its own folder continues the same wandb run (same id; `wandb sync` merges the parts).
        id_file = Path(save_dir) / "wandb" / WANDB_ID_FILE
        if id_file.is_file() and "id" not in kwargs:
            kwargs = {**kwargs, "id": id_file.read_text().strip(), "resume": "allow"}
        from lightning.pytorch.loggers import WandbLogger

        logger = (_wandb_logger_class() if async_log else WandbLogger)(
            save_dir=save_dir,
            project=project,
            group=group,
            name=name,
            tags=list(tags or []),
            offline=resolved == "offline",
            **kwargs,
        )
        logger._wandb_init.pop("anonymous", None)  # Lightning always passes it; wandb warns that it has no effect
        run = logger.experiment  # start the run now, so a failure is caught here
        id_file.parent.mkdir(parents=True, exist_ok=True)
        id_file.write_text(str(getattr(run, "id", "") or logger.version or ""))
        return logger
    except Exception as err:  # noqa: BLE001 - wandb must never fail a run
        message = f"wandb disabled for this run ({type(err).__name__}: {err}); CSV logs are still written."
        warnings.warn(message, stacklevel=2)
        return None
