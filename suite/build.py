"""From a composed config to the objects of a run: its values checked against the constructors' annotations (one
line naming a mistyped key), then the datamodule, model, callbacks, trainer and loggers instantiated."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import hydra
import lightning.pytorch as pl
import torch
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.errors import ConfigError, SuiteError
from core.typecheck import expected_type, type_hints
from suite.plumbing import update_moved_targets
from suite.plumbing.run_config import ConfigInCheckpoint
from suite.plumbing.smoke import SmokeMode
from suite.summary import is_result


def check_value_types(node: Any, what: str) -> None:
    """Refuse a config value whose type the constructor's annotation excludes, before a library trips over it deep
    inside (``trainer.max_epochs=abc`` is an ``AssertionError`` in Lightning's loop): one line naming the key."""
    if not isinstance(node, DictConfig) or "_target_" not in node:
        return
    try:
        target = hydra.utils.get_object(str(node._target_))
    except Exception:  # noqa: BLE001 - an unknown target is reported by the instantiation itself
        return
    hints = type_hints(target)
    for key in node:
        key = str(key)
        if key.startswith("_"):
            continue
        try:
            value = node[key]
        except OmegaConfBaseException:
            continue
        if isinstance(value, DictConfig):
            check_value_types(value, f"{what}.{key}")
            continue
        expected = expected_type(value, hints[key]) if key in hints else None
        if expected:
            raise ConfigError(_wrong_type(node, key, f"{what}.{key}", value, expected))


def _wrong_type(node: DictConfig, key: str, full_key: str, value: Any, expected: str) -> str:
    """``<key>=<value> must be <expected>``, naming the key the user typed: a value interpolated from another key
    (``total_steps: ${trainer.max_steps}``) is reported under that key, with the one that takes it in brackets."""
    raw = node._get_node(key)
    source = re.fullmatch(r"\$\{([\w.]+)\}", str(raw._value())) if raw is not None else None
    if source and not source.group(1).startswith("."):
        return f"{source.group(1)}={value!r} must be {expected} (it sets {full_key})"
    return f"{full_key}={value!r} must be {expected}"


# Typed values of the root config (conf/train.yaml, conf/eval.yaml, conf/paths/): what each must be, so that a
# mistyped command-line value (`seed=abc`, `train=yes`) is one line naming the key, not a traceback deep inside a run.
ROOT_TYPES: dict[str, tuple[type, ...]] = {
    "seed": (int,),
    "num_threads": (int, type(None)),
    "smoke": (bool,),
    "print_config": (bool,),
    "optimized_metric": (str, type(None)),
    "train": (bool,),
    "test": (bool,),
    "test_weights": (str,),
    "eval_at_start": (bool,),
    "ckpt_path": (str, type(None)),
    "cpu_only": (str, type(None)),
    "task_name": (str,),
    "experiment_slug": (str,),
    "group": (str,),
    "paths.root_dir": (str,),
    "paths.data_dir": (str,),
    "paths.log_dir": (str,),
    "paths.output_dir": (str,),
}
_TYPE_NAMES = {int: "int", float: "float", bool: "true or false", str: "a string", type(None): "null"}


def check_root_types(cfg: DictConfig) -> None:
    """Refuse a root-config value of the wrong type (``seed=abc``, ``train=yes``, ``paths.log_dir=5``) with one
    line naming the key, and check the trainer's values before the model's (a model key may interpolate a trainer
    key: ``model.scheduler.total_steps: ${trainer.max_steps}``)."""
    for dotted, allowed in ROOT_TYPES.items():
        parent_key, _, key = dotted.rpartition(".")
        parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
        if not isinstance(parent, DictConfig) or key not in parent:
            continue
        try:
            value = parent[key]
        except OmegaConfBaseException:  # an unresolvable value (`???`): reported where it is used
            continue
        if type(value) in allowed:
            continue
        expected = " or ".join(_TYPE_NAMES[t] for t in allowed)
        if dotted.startswith("paths."):
            expected += f" (a folder; quote a numeric name: {dotted}='{value}')"
        raise ConfigError(_wrong_type(parent, key, dotted, value, expected))
    if isinstance(cfg.get("trainer"), DictConfig):
        check_value_types(cfg.trainer, "trainer")


#: Accelerator values that put a run on the CPU whatever the machine has (``auto`` picks a GPU where there is one).
_CPU_ACCELERATORS = ("cpu",)


def _auto_picks_an_accelerator() -> bool:
    """Whether ``trainer.accelerator=auto`` would run on something other than the CPU on this machine."""
    from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator

    return CUDAAccelerator.is_available() or MPSAccelerator.is_available()


def check_cpu_only(cfg: DictConfig, choices: dict[str, Any] | None = None) -> None:
    """Refuse a GPU (``trainer=gpu``, ``trainer=ddp``, ``trainer.accelerator=gpu``, or ``auto`` on a GPU machine)
    for a method that runs only on the CPU: its experiment says why in ``cpu_only`` (a sentence; ``null`` for
    every method that runs on any device). One line naming the setting and the reason, before anything is built.

    Raises:
        ConfigError: ``trainer=gpu: semdice runs only on the CPU (...); use trainer=cpu``.
    """
    why = cfg.get("cpu_only")
    trainer = cfg.get("trainer")
    if not why or not isinstance(trainer, DictConfig):
        return
    accelerator = str(trainer.get("accelerator", "auto"))
    if accelerator in _CPU_ACCELERATORS or (accelerator == "auto" and not _auto_picks_an_accelerator()):
        return
    group = (choices or {}).get("trainer")
    asked = f"trainer={group}" if group and group not in ("cpu", "default") else f"trainer.accelerator={accelerator}"
    raise ConfigError(
        f"{asked}: {cfg.get('experiment_slug')} runs only on the CPU ({why}); use trainer=cpu (one process)"
    )


def experiment_pairs(conf_dir: Path) -> dict[str, tuple[str, str]]:
    """Each experiment's ``(model, data)`` groups, from the ``override /model:`` and ``override /data:`` lines of
    ``conf/experiment/<slug>.yaml``: the pairings the suite runs."""
    out = {}
    for f in sorted(conf_dir.glob("experiment/*.yaml")):
        text = f.read_text()
        model = re.search(r"override /model:\s*([\w-]+)", text)
        data = re.search(r"override /data:\s*([\w-]+)", text)
        if model and data:
            out[f.stem] = (model.group(1), data.group(1))
    return out


def _model_class(conf_dir: Path, model: str) -> str:
    """The LightningModule a model config builds: where the class its ``_target_`` names is defined (two papers'
    folders that re-export one shared system name one class), the ``_target_`` itself when it does not import, the
    config's name when it names none."""
    f = conf_dir / "model" / f"{model}.yaml"
    found = re.search(r"^_target_:\s*(\S+)", f.read_text(), re.M) if f.is_file() else None
    if not found:
        return model
    try:
        cls = hydra.utils.get_class(found.group(1))
    except Exception:  # noqa: BLE001 - a target that does not import is reported when the model is built
        return found.group(1)
    return f"{cls.__module__}.{cls.__qualname__}"


def check_model_fits_data(choices: dict[str, Any], conf_dir: Path) -> None:
    """Refuse one paper's model on another paper's data (``experiment=leaderbot model=grass``: grass reads
    molecule graphs, the Arena datamodule yields vote counts; otherwise an ``AttributeError`` inside a training
    step). Refused only when the model config is another experiment's, the data config is some experiment's, and no
    experiment trains that model's LightningModule on that data: the experiment's own model on other data
    (``experiment=gated_deltanet data=text``), models of one family (the causal LMs of gated_deltanet, stickbreaking,
    systematic_outliers) and variants no experiment names (``model=rx_dpm_unet data=fashion_mnist``) stay the
    user's choice."""
    model, data, slug = choices.get("model"), choices.get("data"), choices.get("experiment")
    pairs = experiment_pairs(conf_dir)
    owners = {m: e for e, (m, _) in pairs.items()}
    if model not in owners or data not in {d for _, d in pairs.values()} or pairs.get(slug, (None,))[0] == model:
        return
    cls = _model_class(conf_dir, model)
    if any(d == data and _model_class(conf_dir, m) == cls for m, d in pairs.values()):
        return
    raise ConfigError(
        f"model={model} does not run on data={data} (experiment={slug}); model {model} trains on "
        f"data={pairs[owners[model]][1]}: use experiment={owners[model]}"
    )


def instantiate(node: Any, what: str, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate`` that turns a constructor's validation error into a one-line :class:`SuiteError`.

    A ``_target_`` in ``node`` that names an object by the place it had before it moved is pointed at its current
    place first (in place: a saved config then names the current one), so an older run folder or checkpoint builds."""
    update_moved_targets(node)
    check_value_types(node, what)
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


def instantiate_group(cfg: DictConfig | None, what: str) -> list[Any]:
    out = []
    for name, node in (cfg or {}).items():
        if isinstance(node, DictConfig) and "_target_" in node:
            obj = instantiate(node, f"{what}.{name}")
            if obj is not None:
                out.append(obj)
    return out


def build(cfg: DictConfig, data_check: contextlib.AbstractContextManager | None = None) -> dict[str, Any]:
    """Instantiate datamodule, model, callbacks, loggers and trainer from ``cfg``.

    Args:
        cfg: The composed config.
        data_check: Set the datamodule up (read its data) inside this context before any logger starts, so a
            missing or unreadable data file refuses the run before it has a wandb run or a CSV log; ``None``: leave
            it to ``fit``/``test``. Runs over several processes always leave it to them (each rank's setup).
    """
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    if cfg.get("num_threads"):
        torch.set_num_threads(int(cfg.num_threads))
    datamodule = instantiate(cfg.data, "data")
    model = instantiate(cfg.model, "model")
    callbacks = instantiate_group(cfg.get("callbacks"), "callbacks")
    if cfg.get("smoke", False):  # core.smoke.smoke_test: debug modes skip heavy analyses
        callbacks.append(SmokeMode())
    if cfg.trainer.get("fast_dev_run"):  # Lightning skips checkpoints under fast_dev_run but for save_last's
        for cb in callbacks:  # on_train_end: debug=fdr writes none, as the README and `make help` say
            if isinstance(cb, pl.callbacks.ModelCheckpoint):
                cb.save_last = False
    if cfg.trainer.get("enable_progress_bar") is False:  # a bar callback with bars disabled is a Lightning error
        callbacks = [cb for cb in callbacks if not isinstance(cb, pl.callbacks.ProgressBar)]
    config_yaml = OmegaConf.to_yaml(cfg, resolve=True)
    for cb in callbacks:
        if isinstance(cb, ConfigInCheckpoint):
            cb.config_yaml = config_yaml
    # The loggers come last: a wandb logger starts its run (and the CSV logger its folder) as soon as it exists, and
    # a run refused on its trainer settings (`trainer=gpu` without one, `trainer.max_epochs=-5`) or its data must
    # leave nothing behind.
    trainer = instantiate(cfg.trainer, "trainer", callbacks=callbacks, logger=False)
    processes = max(int(trainer.world_size), int(trainer.num_devices) * int(trainer.num_nodes))
    if data_check is not None and processes == 1 and isinstance(datamodule, pl.LightningDataModule):
        with data_check:
            datamodule.prepare_data()
            datamodule.setup("fit" if cfg.get("train", True) else "test")
    loggers = instantiate_group(cfg.get("logger"), "logger")
    trainer.loggers = loggers
    if not loggers:  # Lightning refuses an LR monitor without a logger (`logger=none`)
        trainer.callbacks = [cb for cb in trainer.callbacks if not isinstance(cb, pl.callbacks.LearningRateMonitor)]
    flat = OmegaConf.to_container(cfg, resolve=True)
    for logger in loggers:  # the composed config, so dashboards can group and filter runs by any setting
        logger.log_hyperparams({k: v for k, v in flat.items() if k not in ("hydra",)})
    return {"datamodule": datamodule, "model": model, "trainer": trainer, "config_yaml": config_yaml}


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if not is_result(k):  # the learning-rate monitor's `lr-*`: a curve, not a result
            continue
        if isinstance(v, torch.Tensor) and v.numel() == 1 or isinstance(v, (int, float)):
            out[k] = float(v)
    return out
