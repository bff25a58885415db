"""Loggers: a CSV logger that keeps the curve of a resumed run, and wandb that never blocks or fails a run."""

from __future__ import annotations

import atexit
import collections
import functools
import hashlib
import io
import json
import netrc
import os
import re
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


# Overrides that name no property of the run: where it writes, how it logs, which seed (``-s<seed>`` says that), the
# experiment (the slug says that), the claim runner's bookkeeping. A key matches itself and its children.
NOT_IN_NAME = (
    "experiment",
    "seed",
    "tags",
    "run_name",
    "run_tags",
    "group",
    "ckpt_path",
    "logger",
    "hydra",
    "paths",
    "launcher",
    "local",
    "num_threads",
    "hparams_search",
    "print_config",
    "eval_at_start",
    "test_weights",
    "callbacks.model_checkpoint",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "data.data_dir",
    "data.num_workers",
)
NAME_OVERRIDES_MAX = 60  # characters of the overrides part of a run name; longer ones end in a hash of the whole
TAG_MAX = 64  # wandb's limit on one tag


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def naming_overrides(overrides: list[str]) -> list[str]:
    """The overrides that change what a run is (``model.lr=1e-3``, ``debug=fdr``), without ``+``/``++`` prefixes,
    in the order given; see :data:`NOT_IN_NAME` for the ones left out."""
    kept = []
    for o in overrides:
        key = _override_key(o)
        if any(key == k or key.startswith((f"{k}.", f"{k}/")) for k in NOT_IN_NAME):
            continue
        kept.append(o.lstrip("+"))
    return kept


def _safe(text: str) -> str:
    """``text`` with only ``[A-Za-z0-9._=+-]``: commas become ``+``, brackets, quotes and spaces go, others ``_``."""
    text = text.replace(",", "+")
    text = re.sub(r"[\[\]{}()'\" ]", "", text)
    return re.sub(r"[^A-Za-z0-9._=+-]", "_", text)


def run_name(slug: str, seed: object, overrides: list[str]) -> str:
    """``<slug>-<overrides>-s<seed>``: the overrides that change the run (:func:`naming_overrides`), each as
    ``<last key part>=<value>`` (the full key where two share a last part; ``~key`` reads ``no-key``), joined by
    ``-``; file-name safe. Over :data:`NAME_OVERRIDES_MAX` characters they are cut and end in 8 hex digits of a hash
    of all of them, so two runs that differ keep different names."""
    parts = []
    kept = naming_overrides(overrides)
    keys = [_override_key(o) for o in kept]
    last = [re.split(r"[./]", k)[-1] for k in keys]
    for o, key, short in zip(kept, keys, last, strict=True):
        if "=" not in o:
            parts.append(_safe(f"no-{short}"))
            continue
        value = o.split("=", 1)[1]
        parts.append(_safe(f"{short if last.count(short) == 1 else key}={value}"))
    middle = "-".join(parts)
    if len(middle) > NAME_OVERRIDES_MAX:
        digest = hashlib.sha1(" ".join(kept).encode()).hexdigest()[:8]
        middle = f"{middle[: NAME_OVERRIDES_MAX - 9].rstrip('-')}-{digest}"
    return "-".join(p for p in (_safe(str(slug)), middle, f"s{seed}") if p)


def run_tags(slug: str, experiment_tags: Any, overrides: list[str], tags: Any) -> list[str]:
    """The run's tags: the slug, the experiment's ``experiment_tags`` (its paper or family), one per override that
    changes the run (``model.lr=1e-3``) and the user's ``tags=[...]``; each at most :data:`TAG_MAX` characters, in
    that order, without repeats."""
    user = [tags] if isinstance(tags, str) else list(tags or [])
    found = [str(slug), *(str(t) for t in experiment_tags or [])]
    found += [_safe(o) for o in naming_overrides(overrides)]
    found += [str(t) for t in user]
    return list(dict.fromkeys(t[:TAG_MAX] for t in found if t))


def task_overrides() -> list[str]:
    """This Hydra job's command-line overrides (a multirun's: the job's own values); ``[]`` outside a Hydra job."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return []


class _ConfigOnce:
    """Log the hyper-parameters once: the suite logs the composed config as the run starts (``suite.build``);
    Lightning then logs the module's and datamodule's init arguments again, which the config already holds under
    ``model``/``data``, and would put the model in the run's config twice."""

    _config_logged = False

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        if self._config_logged:
            return
        self._config_logged = True
        super().log_hyperparams(params)


@functools.cache
def _sync_wandb_logger_class() -> type:
    from lightning.pytorch.loggers import WandbLogger

    class SuiteWandbLogger(_ConfigOnce, WandbLogger):
        """Lightning's :class:`WandbLogger`, logging the config once (:class:`_ConfigOnce`)."""

    return SuiteWandbLogger


@functools.cache
def _wandb_logger_class() -> type:
    from lightning.pytorch.loggers import WandbLogger

    class AsyncWandbLogger(_ConfigOnce, WandbLogger):
        """:class:`WandbLogger` whose per-step ``log_metrics`` hands the row to one background thread.

        ``wandb.Run.log`` waits for its record to reach the wandb service process, about 0.5 ms per call on an idle
        machine and several under load, twice a step in the suite (the metrics and the learning-rate monitor). Here
        the training thread only queues the row; one thread logs the queued rows in order every ``interval``
        seconds. Every other use of the run (``logger.experiment``: hyper-parameters, summaries, tables,
        ``finish``) first waits until the queue is empty, and so do ``finalize`` and interpreter exit, so the run's
        history is the same as with synchronous logging. A logging error is reported once as a warning and never
        fails the run (the CSV logger still records). The config is logged once (:class:`_ConfigOnce`).
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
    job_type: str | None = None,
    mode: str = "auto",
    async_log: bool = True,
    system_metadata: bool = True,
    **kwargs: Any,
) -> Logger | None:
    """Build a :class:`WandbLogger`; on any failure warn and return ``None`` (the CSV logger still records).

    Args:
        save_dir: Run folder; wandb writes ``<save_dir>/wandb/offline-run-*/run-*.wandb`` there.
        project: wandb project.
        group: Run group (the paper's slug), so dashboards compare a paper's methods side by side.
        name: Run name (``run_name`` of the config: :func:`run_name`).
        tags: Run tags (``run_tags`` of the config: :func:`run_tags`).
        job_type: wandb job type (a claim's runs: the entry's name).
        mode: ``auto`` (see :func:`wandb_mode`), ``online``, ``offline`` or ``disabled``.
        async_log: Log each step's metrics from a background thread (``AsyncWandbLogger``); ``False``: Lightning's
            synchronous ``WandbLogger``.
        system_metadata: Let wandb collect the machine's metadata and the installed packages as the run starts
            (about 2 s a run); ``False`` (claim runs, :data:`LEAN`) skips both.
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
        if not system_metadata and "settings" not in kwargs:
            import wandb

            kwargs = {**kwargs, "settings": wandb.Settings(**LEAN)}
        logger = (_wandb_logger_class() if async_log else _sync_wandb_logger_class())(
            save_dir=save_dir,
            project=project,
            group=group,
            name=name,
            tags=list(tags or []),
            job_type=job_type,
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


LEAN = {"x_disable_meta": True, "x_save_requirements": False}
"""wandb settings that skip the machine metadata and package list a run collects as it starts: a wandb run then
starts in ~0.1 s instead of ~2 s after the first of its process (claims: many short runs)."""

RUN_FILES = ("metrics.json",)  # files of the run folder saved into the wandb run at its end
SKIPPED_DIRS = ("wandb", "checkpoints", ".hydra", "csv", "tensorboard")  # never scanned for plots
MAX_PLOTS = 100


def run_plots(run_dir: Path) -> list[Path]:
    """The PNG files a run wrote into its folder (any depth, outside :data:`SKIPPED_DIRS`), sorted; at most
    :data:`MAX_PLOTS`."""
    run_dir = Path(run_dir)
    found = [p for p in run_dir.rglob("*.png") if p.is_file() and p.relative_to(run_dir).parts[0] not in SKIPPED_DIRS]
    return sorted(found)[:MAX_PLOTS]


def log_run_files(run: Any, run_dir: Path) -> list[str]:
    """Log what a run wrote into its folder to its wandb ``run``: each plot (:func:`run_plots`) as an image under
    ``plots/<path without .png>`` and ``metrics.json`` as a file (copied into the wandb run, so the offline run
    syncs alone). Returns the keys and file names logged."""
    import wandb

    run_dir = Path(run_dir)
    images = {f"plots/{p.relative_to(run_dir).with_suffix('').as_posix()}": p for p in run_plots(run_dir)}
    if images:
        run.log({key: wandb.Image(str(p), caption=p.name) for key, p in images.items()})
    saved = []
    for name in RUN_FILES:
        src = run_dir / name
        if src.is_file():
            dst = Path(run.dir) / name
            dst.write_bytes(src.read_bytes())
            run.save(str(dst), base_path=run.dir, policy="now")
            saved.append(name)
    return [*images, *saved]


def finish_wandb(logger: Any) -> None:
    """End a run's wandb logger: log the run folder's plots and ``metrics.json`` (:func:`log_run_files`; on an
    interrupted run, what exists), then finish the wandb run. A failure is a warning; the run's results stand."""
    run = logger.experiment
    try:
        log_run_files(run, Path(logger.save_dir))
    except Exception as err:  # noqa: BLE001 - wandb must never fail a run
        warnings.warn(f"wandb could not log the run's files ({type(err).__name__}: {err})", stacklevel=2)
    run.finish()


CLAIM_COLUMNS = ("claim", "text", "metric", "entries", "verdict", "diff", "lo", "hi", "n", "p", "p_holm", "published")


def claim_tables(data: dict[str, Any]) -> dict[str, tuple[list[str], list[list[Any]]]]:
    """A claim data file (``docs/results/data/<slug>.json``) as tables: ``claims`` (one row per claim: verdict,
    difference with its 95% interval, n, p, the paper's effect) and ``runs`` (one row per entry and seed, every
    metric the runs recorded)."""
    claims = []
    for c in data.get("claims") or []:
        n = c.get("n")
        row = {
            **c,
            "claim": c.get("id"),
            "entries": " vs ".join(map(str, c.get("entries") or [])),
            "n": "/".join(map(str, n)) if isinstance(n, list) else n,
        }
        claims.append([_cell(row.get(k)) for k in CLAIM_COLUMNS])
    runs = data.get("runs") or []
    keys = sorted({k for r in runs for k in (r.get("metrics") or {})})
    rows = [[str(r.get("entry")), r.get("seed"), *[_cell((r.get("metrics") or {}).get(k)) for k in keys]] for r in runs]
    return {"claims": (list(CLAIM_COLUMNS), claims), "runs": (["entry", "seed", *keys], rows)}


def _cell(value: Any) -> Any:
    """A value a ``wandb.Table`` column holds: numbers and strings as they are, ``None`` as is, others as text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value)


def log_claim_summary(
    data_file: Path, out_dir: Path, pngs: list[Path] = (), project: str = "iclr25-suite", mode: str = "auto"
) -> Path | None:
    """One wandb run per claim page, ``<slug>-claims`` (group ``<slug>``, job type ``summary``), holding the claim
    data file's ``claims`` and ``runs`` tables (:func:`claim_tables`) as ``wandb.Table``s, each claim's verdict in
    the summary (``verdict/<claim>``) and the page's plots (``pngs``) as images. Written under
    ``<out_dir>/summary`` (an earlier offline summary there is replaced). Returns the wandb run folder, or ``None``
    when wandb is disabled or fails (a warning; the page stands)."""
    resolved = wandb_mode(mode)
    if resolved == "disabled":
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        import shutil

        import wandb

        data = json.loads(Path(data_file).read_text())
        slug = str(data.get("slug") or Path(data_file).stem)
        folder = Path(out_dir) / "summary"
        for old in folder.glob("wandb/offline-run-*"):
            shutil.rmtree(old, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        run = wandb.init(
            dir=str(folder),
            project=project,
            group=slug,
            job_type="summary",
            name=f"{slug}-claims",
            tags=[slug, "claim", "summary"],
            mode="online" if resolved == "online" else "offline",
            config={k: data.get(k) for k in ("slug", "profile", "written", "commit", "machine")},
            reinit="finish_previous",
            settings=wandb.Settings(**LEAN),
        )
        try:
            logged = {name: wandb.Table(columns=cols, data=rows) for name, (cols, rows) in claim_tables(data).items()}
            logged.update({f"plots/{p.stem}": wandb.Image(str(p), caption=p.name) for p in pngs if Path(p).is_file()})
            run.log(logged)
            for c in data.get("claims") or []:
                run.summary[f"verdict/{c.get('id')}"] = c.get("verdict")
            return Path(run.dir).parent
        finally:
            run.finish()
    except Exception as err:  # noqa: BLE001 - wandb must never fail a claim page
        warnings.warn(f"wandb claim summary not logged ({type(err).__name__}: {err})", stacklevel=2)
        return None
