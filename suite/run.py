"""Build and run one experiment from a composed Hydra config (used by ``train.py`` and ``evaluate.py``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import hydra
import lightning.pytorch as pl
import torch
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf

from callbacks.run_config import CONFIG_KEY, ConfigInCheckpoint
from suite.errors import CheckpointError, ConfigError, SuiteError

log = logging.getLogger(__name__)


def instantiate(node: Any, what: str, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate`` that turns a constructor's validation error into a one-line :class:`SuiteError`."""
    try:
        return hydra.utils.instantiate(node, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, SuiteError):
            raise type(cause)(str(cause)) from None
        if isinstance(cause, (ValueError, TypeError)):
            target = node.get("_target_", "?") if isinstance(node, DictConfig) else "?"
            raise ConfigError(f"{what} ({target}): {cause}") from None
        detail = f"{type(cause).__name__}: {cause}" if cause is not None else str(err)
        raise ConfigError(f"{what}: " + " ".join(detail.split())) from None


def _instantiate_group(cfg: DictConfig | None, what: str) -> list[Any]:
    out = []
    for name, node in (cfg or {}).items():
        if isinstance(node, DictConfig) and "_target_" in node:
            obj = instantiate(node, f"{what}.{name}")
            if obj is not None:
                out.append(obj)
    return out


def _run_overrides() -> list[str] | None:
    """This run's command-line overrides (None outside a Hydra run)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return None


def _same_run(overrides: list[str], run_dir: Path) -> bool:
    """Whether ``run_dir`` was started with the same overrides (ignoring ckpt_path and hydra/paths settings)."""
    import yaml

    def key(items: list[str]) -> list[str]:
        ignored = ("ckpt_path=", "hydra.", "paths.", "trainer.enable_progress")
        return sorted(o for o in items if not o.startswith(ignored))

    f = run_dir / ".hydra" / "overrides.yaml"
    return f.exists() and key(yaml.safe_load(f.read_text()) or []) == key(overrides)


def resolve_checkpoint(
    ckpt_path: str | None, output_dir: Path, log_dir: Path | None = None, overrides: list[str] | None = None
) -> str | None:
    """``None`` | ``last`` | a path.

    ``last`` is this run folder's ``checkpoints/last.ckpt`` (a requeued SLURM job, ``hydra.run.dir=`` reused); else
    the newest ``last.ckpt`` under ``log_dir`` of a run started with the *same overrides* (never another
    configuration's weights). A run with nothing to resume starts fresh, so requeued jobs just work.
    """
    if ckpt_path in (None, "", "null"):
        return None
    if ckpt_path == "last":
        own = output_dir / "checkpoints" / "last.ckpt"
        if own.exists():
            return str(own)
        found = []
        if log_dir is not None and overrides is not None:
            found = [p for p in log_dir.glob("runs/*/checkpoints/last.ckpt") if _same_run(overrides, p.parents[1])]
        if found:
            return str(max(found, key=lambda p: p.stat().st_mtime))
        log.warning("ckpt_path=last: no last.ckpt of this configuration found; starting from scratch")
        return None
    path = Path(ckpt_path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    return str(path)


def load_checkpoint(path: str) -> dict[str, Any]:
    """Load a checkpoint without executing pickled code (``weights_only=True``); clear error if truncated/unsafe."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except Exception as err:  # noqa: BLE001 - every failure mode gets the same one-line report
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        raise CheckpointError(
            f"checkpoint {path} is truncated, corrupt or not weights-only loadable ({reason})"
        ) from None


def build(cfg: DictConfig) -> dict[str, Any]:
    """Instantiate datamodule, model, callbacks, loggers and trainer from ``cfg``."""
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    if cfg.get("num_threads"):
        torch.set_num_threads(int(cfg.num_threads))
    datamodule = instantiate(cfg.data, "data")
    model = instantiate(cfg.model, "model")
    callbacks = _instantiate_group(cfg.get("callbacks"), "callbacks")
    if cfg.trainer.get("enable_progress_bar") is False:  # a bar callback with bars disabled is a Lightning error
        callbacks = [cb for cb in callbacks if not isinstance(cb, pl.callbacks.ProgressBar)]
    loggers = _instantiate_group(cfg.get("logger"), "logger")
    if not loggers:  # Lightning refuses an LR monitor without a logger (`logger=none`)
        callbacks = [cb for cb in callbacks if not isinstance(cb, pl.callbacks.LearningRateMonitor)]
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    flat = OmegaConf.to_container(cfg, resolve=True)
    for logger in loggers:  # the composed config, so dashboards can group and filter runs by any setting
        logger.log_hyperparams({k: v for k, v in flat.items() if k not in ("hydra",)})
    for cb in callbacks:
        if isinstance(cb, ConfigInCheckpoint):
            cb.config_yaml = config_yaml
    trainer = instantiate(cfg.trainer, "trainer", callbacks=callbacks, logger=loggers or False)
    return {"datamodule": datamodule, "model": model, "trainer": trainer, "config_yaml": config_yaml}


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, torch.Tensor) and v.numel() == 1 or isinstance(v, (int, float)):
            out[k] = float(v)
    return out


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit and/or test; writes ``config.yaml`` and ``metrics.json`` into the run folder; returns final metrics."""
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    objs = build(cfg)
    (output_dir / "config.yaml").write_text(objs["config_yaml"])
    trainer: pl.Trainer = objs["trainer"]
    log_dir = Path(cfg.paths.log_dir) / cfg.task_name / str(cfg.experiment_slug)
    ckpt = resolve_checkpoint(cfg.get("ckpt_path"), output_dir, log_dir, _run_overrides())
    if ckpt is not None:
        load_checkpoint(ckpt)  # fail early and clearly on a bad file
        log.info("resuming from %s", ckpt)
    metrics: dict[str, float] = {}
    if cfg.get("train", True):
        trainer.fit(objs["model"], datamodule=objs["datamodule"], ckpt_path=ckpt, weights_only=True)
        if trainer.interrupted:  # never let an interrupted run look finished (no metrics.json)
            raise SuiteError(f"run interrupted at global step {trainer.global_step}; resume with ckpt_path=last")
        metrics.update(_scalars(trainer.callback_metrics))
    if cfg.get("test", True):
        trainer.test(objs["model"], datamodule=objs["datamodule"], ckpt_path=None if cfg.get("train", True) else ckpt)
        metrics.update(_scalars(trainer.callback_metrics))
    if trainer.is_global_zero:
        (output_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    finish_loggers(trainer)
    return metrics


def finish_loggers(trainer: pl.Trainer) -> None:
    """Close wandb runs (flushes the offline file; the next job of a multirun gets its own run)."""
    for logger in trainer.loggers:
        if type(logger).__name__ == "WandbLogger" and trainer.is_global_zero:
            try:
                logger.experiment.finish()
            except Exception as err:  # noqa: BLE001 - never lose a finished run over a logger
                log.warning("wandb finish failed: %s", err)


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Rebuild model and data from the config saved in ``cfg.ckpt_path`` and run ``trainer.test``."""
    ckpt = resolve_checkpoint(cfg.ckpt_path, Path(cfg.paths.output_dir))
    state = load_checkpoint(ckpt)
    if CONFIG_KEY not in state:
        raise CheckpointError(f"checkpoint {ckpt} has no saved suite config (was it written by this suite?)")
    saved = OmegaConf.create(state[CONFIG_KEY])
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule = instantiate(saved.data, "data")
    model = instantiate(saved.model, "model")
    loggers = _instantiate_group(cfg.get("logger"), "logger")
    trainer = instantiate(cfg.trainer, "trainer", logger=loggers or False)
    trainer.test(model, datamodule=datamodule, ckpt_path=ckpt, weights_only=True)
    metrics = _scalars(trainer.callback_metrics)
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    return metrics
