"""Build and run one experiment from a composed Hydra config (used by ``train.py`` and ``evaluate.py``)."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import hydra
import lightning.pytorch as pl
import torch
from hydra.errors import InstantiationException
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from callbacks.run_config import CONFIG_KEY, ConfigInCheckpoint
from suite.debug import overfit_verdict
from suite.errors import (
    PREEMPTED_EXIT_CODE,
    CheckpointError,
    ConfigError,
    DataFormatError,
    MissingDataError,
    Preempted,
    SuiteError,
)
from suite.finished import extends, in_slurm_job, read_finished, refusal, reopen, write_finished
from suite.interrupt import INTERRUPTED_EXIT_CODE, SigintAsSigterm
from suite.loggers import truncate_csv
from suite.measured import measured_nothing
from suite.start_metrics import evaluate_at_start, preserved_rng, read_start, write_start
from suite.startup import StartupWatch, slurm_task
from suite.summary import is_result, resume_command, run_summary, shown
from suite.typecheck import expected_type, type_hints

log = logging.getLogger(__name__)


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
    "train": (bool,),
    "test": (bool,),
    "test_weights": (str,),
    "eval_at_start": (bool,),
    "ckpt_path": (str, type(None)),
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
    """The LightningModule a model config builds (its ``_target_``), or the config's name when it names none."""
    f = conf_dir / "model" / f"{model}.yaml"
    found = re.search(r"^_target_:\s*(\S+)", f.read_text(), re.M) if f.is_file() else None
    return found.group(1) if found else model


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


def _choices() -> dict[str, Any]:
    """The config groups this Hydra run composed (``{"model": "grass", ...}``); {} outside a Hydra run."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return dict(HydraConfig.get().runtime.choices)
    except ValueError:
        return {}


def instantiate(node: Any, what: str, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate`` that turns a constructor's validation error into a one-line :class:`SuiteError`."""
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


def _command_overrides() -> list[str]:
    """This run's overrides as a user would retype them: the task's plus the user's own ``hydra.*`` settings."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
    except ValueError:
        return []
    internal = ("hydra.run.", "hydra.sweep.", "hydra.mode", "hydra.job.", "hydra.launcher", "hydra/launcher")
    return [o for o in hc.overrides.hydra if not o.startswith(internal)] + list(hc.overrides.task)


_IGNORED = ("ckpt_path=", "hydra.", "paths.", "trainer.enable_progress", "eval_at_start=")  # none changes training
_BUDGET = ("trainer.max_epochs=", "trainer.max_steps=")


def _key(items: list[str], ignore: tuple[str, ...] = _IGNORED) -> list[str]:
    return sorted(o for o in items if not o.startswith(ignore))


def _saved_overrides(run_dir: Path) -> list[str] | None:
    import yaml

    f = run_dir / ".hydra" / "overrides.yaml"
    try:
        return list(yaml.safe_load(f.read_text()) or []) if f.exists() else None
    except (OSError, yaml.YAMLError):
        return None


def _same_run(overrides: list[str], run_dir: Path, ignore: tuple[str, ...] = _IGNORED) -> bool:
    """Whether ``run_dir`` was started with the same overrides (ignoring ckpt_path and hydra/paths settings)."""
    saved = _saved_overrides(run_dir)
    return saved is not None and _key(saved, ignore) == _key(overrides, ignore)


def find_resumable(
    log_dir: Path, overrides: list[str], max_epochs: int | None = None, max_steps: int | None = -1
) -> tuple[Path | None, str]:
    """The run folder ``ckpt_path=last`` continues in, and a note for the user.

    The newest ``runs/*/checkpoints/last.ckpt`` of an interrupted run started with the same overrides; else of one
    that differs only in ``trainer.max_epochs``/``trainer.max_steps`` and that this budget (``max_epochs``,
    ``max_steps``: the composed trainer's) trains further (extending a run's budget: it resumes and says so); else
    none (a new run, also said). Never another configuration's weights, and never a finished run
    (:mod:`suite.finished`): when the only candidates finished, a :class:`SuiteError` says so and how to extend one.
    """
    ckpts = sorted(log_dir.glob("runs/*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    runs = [p.parents[1] for p in ckpts]
    same = [r for r in runs if _same_run(overrides, r) and read_finished(r) is None]
    if same:
        return same[-1], f"ckpt_path=last: resuming {shown(same[-1] / 'checkpoints' / 'last.ckpt')} in its own folder"
    budget = [r for r in runs if _same_run(overrides, r, _IGNORED + _BUDGET)]
    longer = [r for r in budget if (done := read_finished(r)) is None or extends(done, max_epochs, max_steps)]
    if longer:
        run = longer[-1]
        before = [o for o in _saved_overrides(run) or [] if o.startswith(_BUDGET)] or ["the experiment's budget"]
        now = [o for o in overrides if o.startswith(_BUDGET)] or ["the experiment's budget"]
        return run, (
            f"ckpt_path=last: extending {shown(run)} from {' '.join(before)} to {' '.join(now)} "
            "(resumes from its last.ckpt in its own folder)"
        )
    if budget:  # every run of this configuration finished, and this budget trains none of them further
        raise SuiteError(refusal(budget[-1], read_finished(budget[-1]) or {}, max_steps))
    if ckpts:
        return None, (
            f"ckpt_path=last: no run under {shown(log_dir / 'runs')} was started with these overrides; starting a "
            "new run (to start from another run's weights pass ckpt_path=<its checkpoints/last.ckpt>)"
        )
    return None, f"ckpt_path=last: nothing to resume under {shown(log_dir / 'runs')}; starting a new run"


def resolve_checkpoint(
    ckpt_path: str | None,
    output_dir: Path,
    log_dir: Path | None = None,
    overrides: list[str] | None = None,
    budget: tuple[int | None, int | None] = (None, -1),
) -> str | None:
    """``None`` | ``last`` | a path.

    ``last`` is this run folder's ``checkpoints/last.ckpt`` (``python -m train`` points ``hydra.run.dir`` at the
    folder it resumes, see :func:`suite.cli.resume_in_place`; a requeued SLURM job reuses its folder); else the
    newest ``last.ckpt`` under ``log_dir`` of an interrupted run started with the *same overrides* (never another
    configuration's weights). A run with nothing to resume starts fresh, so requeued jobs just work. A finished
    folder is resumed only when ``budget`` (``trainer.max_epochs``, ``trainer.max_steps``) trains it further;
    otherwise :class:`SuiteError` (:mod:`suite.finished`).
    """
    if ckpt_path in (None, "", "null"):
        return None
    if ckpt_path == "last":
        own = output_dir / "checkpoints" / "last.ckpt"
        if own.exists():
            done = read_finished(output_dir)
            if done is not None and not extends(done, *budget):
                raise SuiteError(refusal(output_dir, done, budget[1]))
            return str(own)
        found = []
        if log_dir is not None and overrides is not None:
            found = [
                p
                for p in log_dir.glob("runs/*/checkpoints/last.ckpt")
                if _same_run(overrides, p.parents[1]) and read_finished(p.parents[1]) is None
            ]
        if found:
            return str(max(found, key=lambda p: p.stat().st_mtime))
        log.info("ckpt_path=last: no last.ckpt of an interrupted run of this configuration found; starting afresh")
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
        raise CheckpointError(
            f"checkpoint {path} is truncated, corrupt or not weights-only loadable ({_load_reason(err)}); "
            "use a checkpoint the suite wrote (<run>/checkpoints/last.ckpt)"
        ) from None


def _load_reason(err: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` failed, in a few words, never repeating torch's advice to retry with
    the unsafe setting (the suite never unpickles code)."""
    text = " ".join(str(err).split())
    if "Unsupported operand" in text or "invalid load key" in text:
        return "not a PyTorch checkpoint file"
    if "Unsupported global" in text or "Weights only load failed" in text:
        m = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        return f"it holds pickled Python objects{f' ({m.group(1)})' if m else ''}, which are never loaded"
    if "invalid load key" in text or "not a zip" in text.lower() or "magic number" in text:
        return "not a PyTorch checkpoint file"
    if "failed finding central directory" in text or "unexpected EOF" in text or "EOF" in text:
        return "the file ends early"
    sentences = [s for s in re.split(r"(?<=[.;])\s+", text) if "weights_only" not in s]
    return (" ".join(sentences) or type(err).__name__)[:160]


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
    callbacks = _instantiate_group(cfg.get("callbacks"), "callbacks")
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
    loggers = _instantiate_group(cfg.get("logger"), "logger")
    trainer.loggers = loggers
    if not loggers:  # Lightning refuses an LR monitor without a logger (`logger=none`)
        trainer.callbacks = [cb for cb in trainer.callbacks if not isinstance(cb, pl.callbacks.LearningRateMonitor)]
    flat = OmegaConf.to_container(cfg, resolve=True)
    for logger in loggers:  # the composed config, so dashboards can group and filter runs by any setting
        logger.log_hyperparams({k: v for k, v in flat.items() if k not in ("hydra",)})
    trainer.suite_smoke = bool(cfg.get("smoke", False))  # suite.debug.smoke_test: debug modes skip heavy analyses
    return {"datamodule": datamodule, "model": model, "trainer": trainer, "config_yaml": config_yaml}


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if not is_result(k):  # the learning-rate monitor's `lr-*`: a curve, not a result
            continue
        if isinstance(v, torch.Tensor) and v.numel() == 1 or isinstance(v, (int, float)):
            out[k] = float(v)
    return out


def train(cfg: DictConfig) -> dict[str, float]:
    """Fit and/or test; writes ``config.yaml`` and ``metrics.json`` into the run folder; returns final metrics."""
    output_dir = Path(str(cfg.paths.output_dir))
    fresh = _only_hydra_files(output_dir, cfg)
    try:
        check_root_types(cfg)
        check_model_fits_data(_choices(), Path(__file__).resolve().parents[1] / "conf")
        output_dir.mkdir(parents=True, exist_ok=True)
        with StartupWatch(output_dir) as watch:  # SLURM tasks: one failing before training starts ends them all
            return _train(cfg, output_dir, watch)
    except REFUSALS:
        # A run refused before it started (its config, its data) leaves nothing worth keeping: remove the folder
        # Hydra made for it, so that `make compare` never counts it as an unfinished run. Never a folder that held
        # anything else (a resumed run), nor one shared by the tasks of a SLURM job (they read each other's startup
        # markers there).
        if fresh and slurm_task() is None and _only_hydra_files(output_dir, cfg):
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
    ckpt = resolve_checkpoint(cfg.get("ckpt_path"), output_dir, log_dir, _run_overrides(), _budget(cfg))
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
        metrics.update(_scalars(trainer.callback_metrics))
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
        metrics.update(_scalars(trainer.callback_metrics))
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
    """Close wandb runs (flushes the offline file; the next job of a multirun gets its own run)."""
    from lightning.pytorch.loggers import WandbLogger

    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger) and trainer.is_global_zero:
            try:
                logger.experiment.finish()
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
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule = instantiate(saved.data, "data")
    model = instantiate(saved.model, "model")
    trainer = instantiate(cfg.trainer, "trainer", logger=False)
    if max(int(trainer.world_size), int(trainer.num_devices) * int(trainer.num_nodes)) == 1:
        datamodule.prepare_data()  # where test would first read the data, but before a logger writes anything
        datamodule.setup("test")
    trainer.loggers = _instantiate_group(cfg.get("logger"), "logger")
    watch.arm(trainer)
    trainer.test(model, datamodule=datamodule, ckpt_path=ckpt, weights_only=True, verbose=False)
    metrics = _scalars(trainer.callback_metrics)
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    if trainer.is_global_zero:
        print(run_summary(out, metrics, f"evaluation of {shown(ckpt)}"), flush=True)
    release_process_group()
    return metrics
