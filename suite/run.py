"""Build and run one experiment from a composed Hydra config (used by ``train.py`` and ``evaluate.py``)."""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from core.checkpoint import load_checkpoint
from core.errors import (
    PREEMPTED_EXIT_CODE,
    CheckpointError,
    ConfigError,
    DataFormatError,
    MissingDataError,
    Preempted,
    SuiteError,
)
from suite.build import (
    build,
    check_cpu_only,
    check_model_fits_data,
    check_root_types,
    instantiate,
    instantiate_group,
    scalars,
)
from suite.debug import overfit_verdict
from suite.finished import extends, in_slurm_job, read_finished, reopen, write_finished
from suite.interrupt import INTERRUPTED_EXIT_CODE, SigintAsSigterm
from suite.loggers import finish_wandb, truncate_csv
from suite.measured import measured_nothing
from suite.plumbing.run_config import CONFIG_KEY
from suite.resume import resolve_checkpoint, run_overrides
from suite.rundir import read_start, write_devices, write_start
from suite.start_metrics import evaluate_at_start, preserved_rng
from suite.startup import StartupWatch, slurm_task
from suite.summary import resume_command, run_summary, shown

log = logging.getLogger(__name__)


def _choices() -> dict[str, Any]:
    """The config groups this Hydra run composed (``{"model": "grass", ...}``); {} outside a Hydra run."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return dict(HydraConfig.get().runtime.choices)
    except ValueError:
        return {}


def _command_overrides() -> list[str]:
    """This run's overrides as a user would retype them: the task's plus the user's own ``hydra.*`` settings."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
    except ValueError:
        return []
    internal = ("hydra.run.", "hydra.sweep.", "hydra.mode", "hydra.job.", "hydra.launcher", "hydra/launcher")
    return [o for o in hc.overrides.hydra if not o.startswith(internal)] + list(hc.overrides.task)


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit and/or test; writes ``config.yaml`` and ``metrics.json`` into the run folder; returns final metrics."""
    output_dir = Path(str(cfg.paths.output_dir))
    fresh = _only_hydra_files(output_dir, cfg)
    try:
        check_root_types(cfg)
        check_model_fits_data(_choices(), Path(__file__).resolve().parents[1] / "conf")
        check_cpu_only(cfg, _choices())
        output_dir.mkdir(parents=True, exist_ok=True)
        with StartupWatch(output_dir) as watch:  # SLURM tasks: one failing before training starts ends them all
            return _train(cfg, output_dir, watch)
    except REFUSALS:
        # A run refused before it started (its config, its data) leaves nothing worth keeping: remove the folder
        # Hydra made for it, so that `make compare` never counts it as an unfinished run. Never a folder that held
        # anything else (a resumed run), nor one shared by the tasks of a SLURM job (they read each other's startup
        # markers there). A run of several processes reads its data in each rank, inside fit, after the launching
        # process wrote the config and the loggers' first files: refused there, before a checkpoint or a result,
        # its folder goes too (the launching process removes it; the other ranks only ever add their logs).
        if fresh and slurm_task() is None and (_only_hydra_files(output_dir, cfg) or _never_trained(output_dir)):
            remove_run_folder(output_dir, Path(str(cfg.paths.log_dir)))
        raise


REFUSALS = (ConfigError, MissingDataError, DataFormatError, CheckpointError)
"""Errors that refuse a run before it trains or tests anything: its folder is removed (:func:`remove_run_folder`)."""


def remove_run_folder(run_dir: Path, log_dir: Path) -> None:
    """Remove a refused run's folder and the parents it leaves empty (``runs/``, ``<slug>/``, ``<task>/``), up to
    but never including ``log_dir``."""
    shutil.rmtree(run_dir, ignore_errors=True)
    log_dir = log_dir.resolve()
    parent = run_dir.resolve().parent
    while parent != log_dir and log_dir in parent.parents:
        try:
            parent.rmdir()  # only when empty
        except OSError:
            break
        parent = parent.parent


def _never_trained(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` has nothing of its own to keep: no checkpoint, no result, no finished marker
    (only its config, logs and the loggers' first files)."""
    if not run_dir.is_dir():
        return False
    kept = ("checkpoints", "metrics.json", "finished.json", "start_metrics.json")
    return not any((run_dir / name).exists() for name in kept)


def _only_hydra_files(run_dir: Path, cfg: DictConfig) -> bool:
    """Whether ``run_dir`` holds nothing but what Hydra writes at the start of a job (``.hydra/``, ``<task>.log``)."""
    if not run_dir.is_dir():
        return False
    return {p.name for p in run_dir.iterdir()} <= {".hydra", f"{cfg.get('task_name')}.log"}


def _budget(cfg: DictConfig) -> tuple[int | None, int | None]:
    """The trainer's ``(max_epochs, max_steps)``: what a finished run's marker is compared with."""
    return cfg.trainer.get("max_epochs"), cfg.trainer.get("max_steps", -1)


def _already_finished(output_dir: Path) -> dict[str, float]:
    """A SLURM job of a finished run (a requeue, a claim rerun): nothing to do; its results are what it wrote."""
    print(f"note: {shown(output_dir)} already finished (its finished.json); this job has nothing to do", flush=True)
    try:
        return {k: float(v) for k, v in json.loads((output_dir / "metrics.json").read_text()).items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _train(cfg: DictConfig, output_dir: Path, watch: StartupWatch) -> dict[str, float]:
    done = read_finished(output_dir)
    if cfg.get("ckpt_path") == "last" and done is not None and not extends(done, *_budget(cfg)) and in_slurm_job():
        return _already_finished(output_dir)
    log_dir = Path(cfg.paths.log_dir) / cfg.task_name / str(cfg.experiment_slug)
    # before anything is written into the folder: a refused resume leaves a finished run as it was
    ckpt = resolve_checkpoint(cfg.get("ckpt_path"), output_dir, log_dir, run_overrides(), _budget(cfg))
    # the data are read where fit would first read them; with eval_at_start its probe validation read them first,
    # under preserved random states, and so does this early read
    state = load_checkpoint(ckpt) if ckpt is not None else None  # a corrupt file refuses the run before it starts
    at_start = cfg.get("train", True) and ckpt is None and cfg.get("eval_at_start")
    objs = build(cfg, preserved_rng() if at_start else contextlib.nullcontext())
    trainer: pl.Trainer = objs["trainer"]
    if done is not None and trainer.is_global_zero and cfg.get("train", True):
        # extended (a larger budget) or rerun afresh in its folder: not finished until this fit ends
        kept = reopen(output_dir)
        if kept is not None:
            log.info("the finished run's metrics.json is kept as %s", shown(kept))
    (output_dir / "config.yaml").write_text(objs["config_yaml"])
    if trainer.is_global_zero:  # what runs this process (`make compare` labels runs by it, never by `trainer=`)
        write_devices(output_dir, what_runs(trainer), int(state.get("global_step", 0)) if state is not None else None)
    if state is not None:
        step = int(state.get("global_step", 0))
        if Path(ckpt).resolve().parents[1] == output_dir.resolve() and trainer.is_global_zero:
            truncate_csv(output_dir / "csv" / "metrics.csv", step)  # the curve continues from the checkpoint
        log.info("resuming from %s (global step %d) in %s", shown(ckpt), step, shown(output_dir))
    elif trainer.is_global_zero:
        # a fresh run in a reused folder (a claim entry rerun with `--only`, a requeued job that never checkpointed):
        # the folder's old curve is not this run's, and ResumableCSVLogger would otherwise append to it
        truncate_csv(output_dir / "csv" / "metrics.csv", -1)
    metrics: dict[str, float] = {}
    best = _test_best_weights(cfg, trainer)
    watch.arm(trainer)
    if cfg.get("train", True) and ckpt is None:  # a resumed run keeps the start its first process recorded
        start = evaluate_at_start(cfg, objs["model"], objs["datamodule"], trainer) if cfg.get("eval_at_start") else {}
        if trainer.is_global_zero:
            write_start(output_dir, start)
    if cfg.get("train", True):
        ctrl_c = SigintAsSigterm(trainer)
        try:
            with ctrl_c:
                trainer.fit(objs["model"], datamodule=objs["datamodule"], ckpt_path=ckpt, weights_only=True)
        except SIGTERMException:
            finish_loggers(trainer)
            last = output_dir / "checkpoints" / "last.ckpt"
            raise Preempted(
                f"stopped by {'SIGINT (Ctrl-C)' if ctrl_c.received else 'SIGTERM'} at global step "
                f"{trainer.global_step} (epoch {trainer.current_epoch}); wrote {shown(last)}\n"
                f"resume (continues in the same run folder): {resume_command(_command_overrides(), output_dir)}",
                exit_code=INTERRUPTED_EXIT_CODE if ctrl_c.received else PREEMPTED_EXIT_CODE,
            ) from None
        if trainer.interrupted:  # never let an interrupted run look finished (no metrics.json)
            raise SuiteError(f"run interrupted at global step {trainer.global_step}; resume with ckpt_path=last")
        metrics.update(scalars(trainer.callback_metrics))
    if cfg.get("test", True):
        test_ckpt = None if cfg.get("train", True) else ckpt
        if best:
            test_ckpt = trainer.checkpoint_callback.best_model_path
            if not test_ckpt:
                raise SuiteError("test_weights=best: no checkpoint was saved (no validation ran during training)")
            metrics["test/weights_step"] = float(load_checkpoint(test_ckpt).get("global_step", -1))
            score = trainer.checkpoint_callback.best_model_score  # the selected weights' own validation value
            if score is not None:  # the val/* keys above are the final model's last validation
                metrics["test/weights_val"] = float(score)
            log.info("testing the best-validation weights: %s", shown(test_ckpt))
        trainer.test(
            objs["model"],
            datamodule=objs["datamodule"],
            ckpt_path=test_ckpt,
            weights_only=True,
            verbose=False,  # the summary below names every metric once, not one column per test dataloader
        )
        metrics.update(scalars(trainer.callback_metrics))
    if cfg.get("train", True):
        metrics.update(read_start(output_dir))  # `<key>@start`: the step-0 values (eval_at_start)
    if trainer.is_global_zero:
        (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
        if cfg.get("train", True):  # complete: `ckpt_path=last` never resumes it with this budget again
            write_finished(output_dir, trainer.global_step, trainer.current_epoch, *_budget(cfg))
    finish_loggers(trainer)
    if trainer.is_global_zero:
        print(run_summary(output_dir, metrics, "debug run" if cfg.get("smoke") else "run"), flush=True)
        if cfg.get("test", True) and not any(k.startswith("test/") for k in metrics):
            print("note: the test measured nothing (no test/* metric was logged: no test batch ran?)", flush=True)
        slug, predicted = str(cfg.get("experiment_slug")), cfg.get("method_predicted")
        note = measured_nothing(slug, cfg.get("method_metrics"), metrics, predicted)
        if note and cfg.get("test", True):
            print(note, flush=True)
        if cfg.get("train", True) and trainer.overfit_batches:  # debug=overfit: say whether the batch was learnt
            check, slug = cfg.get("overfit_check"), str(cfg.get("experiment_slug"))
            print(overfit_verdict(output_dir / "csv" / "metrics.csv", check, slug), flush=True)
    release_process_group()
    return metrics


def what_runs(trainer: pl.Trainer) -> dict[str, Any]:
    """The accelerator, device count, processes and strategy ``trainer`` runs on (and the GPU's name on one)."""
    import torch

    kind = type(trainer.accelerator).__name__.removesuffix("Accelerator").lower()
    kind = {"cuda": "gpu", "xla": "tpu"}.get(kind, kind)
    out: dict[str, Any] = {
        "accelerator": kind,
        "devices": int(trainer.num_devices),
        "num_nodes": int(trainer.num_nodes),
        "world_size": int(trainer.world_size),
        "strategy": str(getattr(trainer.strategy, "strategy_name", type(trainer.strategy).__name__)),
    }
    root = getattr(trainer.strategy, "root_device", None)
    if kind == "gpu" and root is not None and root.type == "cuda":
        out["device_name"] = torch.cuda.get_device_name(root)
    return out


def _test_best_weights(cfg: DictConfig, trainer: pl.Trainer) -> bool:
    """Whether ``test`` scores the best-validation checkpoint of this fit (``test_weights=best``); checks the config."""
    choice = str(cfg.get("test_weights", "final"))
    if choice not in ("final", "best"):
        raise ConfigError(f"test_weights={choice}: expected final or best")
    if choice == "final" or not cfg.get("train", True):
        return False
    ckpt_cb = trainer.checkpoint_callback
    if ckpt_cb is None or ckpt_cb.monitor is None:
        raise ConfigError(
            "test_weights=best needs a checkpoint callback that monitors a validation metric: "
            "callbacks.model_checkpoint.monitor=val/<metric> callbacks.model_checkpoint.mode=min|max"
        )
    return True


def release_process_group() -> None:
    """Destroy the DDP process group once a run's results are written. Left to interpreter exit, gloo's background
    threads can still be joinable when C++ statics are torn down ("terminate called without an active exception",
    SIGABRT after a finished run); the next run of a multirun initialises a fresh group."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def finish_loggers(trainer: pl.Trainer) -> None:
    """Close wandb runs after logging the run folder's plots and ``metrics.json`` to them (flushes the offline file;
    the next job of a multirun gets its own run)."""
    from lightning.pytorch.loggers import WandbLogger

    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger) and trainer.is_global_zero:
            try:
                finish_wandb(logger)
            except Exception as err:  # noqa: BLE001 - never lose a finished run over a logger
                log.warning("wandb finish failed: %s", err)


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Rebuild model and data from the config saved in ``cfg.ckpt_path`` and run ``trainer.test``."""
    output_dir = Path(str(cfg.paths.output_dir))
    fresh = _only_hydra_files(output_dir, cfg)
    try:
        check_root_types(cfg)
        with StartupWatch(cfg.paths.output_dir) as watch:
            return _evaluate(cfg, watch)
    except REFUSALS:  # a missing or corrupt checkpoint, its data: no evaluation folder is left behind
        if fresh and slurm_task() is None and _only_hydra_files(output_dir, cfg):
            remove_run_folder(output_dir, Path(str(cfg.paths.log_dir)))
        raise


def _evaluate(cfg: DictConfig, watch: StartupWatch) -> dict[str, float]:
    ckpt = resolve_checkpoint(cfg.ckpt_path, Path(cfg.paths.output_dir))
    state = load_checkpoint(ckpt)
    if CONFIG_KEY not in state:
        raise CheckpointError(f"checkpoint {ckpt} has no saved suite config (was it written by this suite?)")
    saved = OmegaConf.create(state[CONFIG_KEY])
    asked = {"accelerator": cfg.trainer.get("accelerator", "auto")}  # the method's own saved `cpu_only` reason
    check_cpu_only(OmegaConf.create({k: saved.get(k) for k in ("cpu_only", "experiment_slug")} | {"trainer": asked}))
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule = instantiate(saved.data, "data")
    model = instantiate(saved.model, "model")
    trainer = instantiate(cfg.trainer, "trainer", logger=False)
    if max(int(trainer.world_size), int(trainer.num_devices) * int(trainer.num_nodes)) == 1:
        datamodule.prepare_data()  # where test would first read the data, but before a logger writes anything
        datamodule.setup("test")
    trainer.loggers = instantiate_group(cfg.get("logger"), "logger")
    watch.arm(trainer)
    trainer.test(model, datamodule=datamodule, ckpt_path=ckpt, weights_only=True, verbose=False)
    metrics = scalars(trainer.callback_metrics)
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    if trainer.is_global_zero:
        print(run_summary(out, metrics, f"evaluation of {shown(ckpt)}"), flush=True)
    release_process_group()
    return metrics
