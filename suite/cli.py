"""One-line errors for the Hydra entry points."""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from hydra.errors import ConfigCompositionException, HydraException, MissingConfigException, OverrideParseException
from omegaconf.errors import OmegaConfBaseException

from core.errors import PREEMPTED_EXIT_CODE, Preempted, SuiteError
from suite.quiet import quiet_console
from suite.resume import find_resumable


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).strip().splitlines() if part.strip())


def unselected_blocks(node: object) -> set[str]:
    """The settings blocks of ``node`` that its own choice leaves unused: where a string value names a sibling
    mapping (leaderbot's ``optimizer: newton`` beside ``newton: {...}``), that mapping is the chosen option's
    settings, and a sibling mapping of the same kind (sharing at least half of its keys with a chosen one:
    ``lbfgs: {lr, max_iter, ...}``) belongs to an option not chosen; the module never reads it."""
    from omegaconf import DictConfig, OmegaConf

    if not isinstance(node, DictConfig):
        return set()
    blocks: dict[str, set[str]] = {}
    chosen: set[str] = set()
    for key in node:
        child = node._get_node(str(key))
        if isinstance(child, DictConfig) and not OmegaConf.is_missing(node, str(key)):
            blocks[str(key)] = {str(k) for k in child}
    for key in node:
        value = node._get_node(str(key))
        raw = value._value() if value is not None and not isinstance(value, DictConfig) else None
        if isinstance(raw, str) and raw in blocks:
            chosen.add(raw)
    if not chosen:
        return set()
    return {
        name
        for name, keys in blocks.items()
        if name not in chosen and any(2 * len(keys & blocks[c]) >= len(keys) > 0 for c in chosen)
    }


def _dotted_keys(node: object, prefix: str = "", depth: int = 4) -> list[str]:
    """Every key below ``node`` that the composed config uses, as a dotted path (``optimizer.lr``), a few levels
    deep; the settings of an option the config does not choose are left out (:func:`unselected_blocks`)."""
    from omegaconf import DictConfig

    out: list[str] = []
    if not isinstance(node, DictConfig) or depth == 0:
        return out
    unused = unselected_blocks(node)
    for key in node:
        key = str(key)
        if key.startswith("_") or key in unused:
            continue
        out.append(prefix + key)
        try:
            child = node._get_node(key)
        except Exception:  # noqa: BLE001 - the hint is best effort
            continue
        out += _dotted_keys(child, f"{prefix}{key}.", depth - 1)
    return out


def closest_key(wrong: str, parent: object, parent_key: str = "") -> str | None:
    """The valid key closest to a misspelt one: a sibling (``model.lrr`` -> ``model.lr``) or a key nested below
    the same parent whose last part matches (``model.lrr`` -> ``model.optimizer.lr``)."""
    keys = _dotted_keys(parent)
    if not keys:
        return None
    prefix = f"{parent_key}." if parent_key else ""
    by_last: dict[str, list[str]] = {}
    for k in keys:
        by_last.setdefault(k.rsplit(".", 1)[-1], []).append(k)
    siblings = [k for k in keys if "." not in k]
    close = difflib.get_close_matches(wrong, siblings, n=1, cutoff=0.75)
    if close:
        return prefix + close[0]
    close = difflib.get_close_matches(wrong, list(by_last), n=1, cutoff=0.6)
    if close:
        return prefix + min(by_last[close[0]], key=len)
    return None


def _config_hint(err: BaseException) -> str:
    """Explain a Hydra/OmegaConf error in one line, suggesting the closest valid key for a misspelling."""
    msg = str(err)
    cause = err.__cause__ or err
    full_key = getattr(cause, "full_key", None)
    m = re.search(r"Key '([^']+)' is not in struct", msg + str(cause))
    parent = getattr(cause, "parent_node", None) or getattr(cause, "object", None)
    if m and full_key:
        suggestion = ""
        try:
            parent_key = str(full_key).rsplit(".", 1)[0] if "." in str(full_key) else ""
            close = closest_key(m.group(1), parent, parent_key)
            if close:
                suggestion = f" (did you mean '{close}'?)"
        except Exception:  # noqa: BLE001 - the hint is best effort
            pass
        return f"unknown config key '{full_key}'{suggestion}"
    msg = msg.split("Config search path")[0]
    return _one_line(msg.replace("Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.", ""))


def fail(message: str) -> None:
    """Print ``error: <message>`` as one line on stderr and exit with status 2."""
    print(f"error: {_one_line(message)}", file=sys.stderr, flush=True)
    sys.exit(2)


def preempted(message: str, exit_code: int = PREEMPTED_EXIT_CODE) -> None:
    """Print what a SIGTERM'd (or Ctrl-C'd) run wrote and how to resume it, then exit with ``exit_code``
    (:data:`PREEMPTED_EXIT_CODE`, 143, for SIGTERM; 130 for SIGINT)."""
    lines = str(message).strip().splitlines()
    print("\n".join(["interrupted: " + lines[0], *lines[1:]]), file=sys.stderr, flush=True)
    sys.exit(exit_code)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Inside a Hydra task: turn :class:`SuiteError` into one line + exit 2 (``SystemExit`` passes through Hydra's
    job runner without its multi-line "Error executing job" report); a SIGTERM'd run exits 143, a Ctrl-C'd one 130."""
    quiet_console()  # Hydra has configured logging by now
    try:
        yield
    except Preempted as err:
        preempted(str(err), err.exit_code)
    except SuiteError as err:
        fail(str(err))


def resume_in_place(argv: list[str]) -> list[str]:
    """``python -m train ... ckpt_path=last`` continues in the run folder it resumes from.

    Before Hydra creates a new folder, look for the newest run of this experiment (``logs/<task>/<slug>/runs/``)
    started with the same overrides (ignoring ``ckpt_path``) that did not finish, or, failing that, one that differs
    only in the budget (``trainer.max_epochs`` / ``trainer.max_steps``) and that the new budget trains further
    (extending a run), and add ``hydra.run.dir=<that folder>``; when only finished runs match, refuse (one line,
    :func:`suite.resume.find_resumable`). Multiruns and an explicit ``hydra.run.dir`` are left alone.
    """
    args = argv[1:]
    if "ckpt_path=last" not in args or any(a in ("-m", "--multirun") or a.startswith("hydra.run.dir=") for a in args):
        return argv
    from hydra import compose, initialize_config_dir

    overrides = [a for a in args if not a.startswith("-")]
    root = Path(__file__).resolve().parents[1]
    try:
        with initialize_config_dir(config_dir=str(root / "conf"), version_base="1.3"):
            cfg = compose("train", overrides=overrides)
        log_dir = Path(str(cfg.paths.log_dir)) / str(cfg.task_name) / str(cfg.experiment_slug)
        budget = (cfg.trainer.get("max_epochs"), cfg.trainer.get("max_steps", -1))
    except Exception:  # noqa: BLE001 - Hydra itself reports a bad command line in one line below
        return argv
    task = [o for o in overrides if not o.startswith(("hydra.", "hydra/"))]
    found, note = find_resumable(log_dir, task, *budget)  # a finished run: SuiteError, before Hydra writes anything
    if note:
        print(f"note: {note}", file=sys.stderr, flush=True)
    if found is None:
        return argv
    return [*argv, f"hydra.run.dir={found}"]


LR_ALIAS = "model.lr"


def learning_rate_keys(model: object, slug: str) -> list[str]:
    """The key(s) of an experiment's model config that ``model.lr`` sets: its own ``lr``; else ``optimizer.lr``
    (and a one-cycle scheduler's ``max_lr``, which overrides the optimiser's); else the ``lr`` of the solver that
    ``optimizer`` names (leaderbot: ``newton.lr``, the first Newton step length); else every per-stage ``*_lr``
    (tulip). Paths relative to ``model``."""
    from omegaconf import DictConfig

    if not isinstance(model, DictConfig):
        raise SuiteError(f"{LR_ALIAS}: experiment '{slug}' has no model config")
    if "lr" in model:
        return ["lr"]
    opt = model.get("optimizer")
    if isinstance(opt, DictConfig) and "lr" in opt:
        sched = model.get("scheduler")
        return ["optimizer.lr"] + (["scheduler.max_lr"] if isinstance(sched, DictConfig) and "max_lr" in sched else [])
    if isinstance(opt, str):
        solver = model.get(opt)
        if isinstance(solver, DictConfig) and "lr" in solver:
            return [f"{opt}.lr"]
        raise SuiteError(f"{LR_ALIAS}: model.optimizer={opt} of experiment '{slug}' has no learning rate")
    stages = [str(k) for k in model if str(k).endswith("_lr")]
    if stages:
        return stages
    raise SuiteError(f"{LR_ALIAS}: experiment '{slug}' has no learning rate (its model has no lr or optimizer.lr)")


def _compose(overrides: list[str]) -> object:
    from hydra import compose, initialize_config_dir

    root = Path(__file__).resolve().parents[1]
    with initialize_config_dir(config_dir=str(root / "conf"), version_base="1.3"):
        return compose("train", overrides=overrides)


def learning_rate_alias(argv: list[str]) -> list[str]:
    """``model.lr=<v>`` (the README's sweep line) becomes the experiment's own learning-rate key(s)
    (:func:`learning_rate_keys`): ``model.optimizer.lr=<v>`` for most; where one rate sets several keys the others
    follow the first by interpolation, so a sweep stays one axis. Prints one line saying what it set."""
    args = argv[1:]
    pattern = re.compile(r"^(\+{0,2})model\.lr=(.*)$", re.S)
    hits = [(i, m) for i, a in enumerate(args) if (m := pattern.match(a))]
    if not hits:
        return argv
    from hydra.core.override_parser.overrides_parser import OverridesParser

    rest = [a for i, a in enumerate(args) if i not in {j for j, _ in hits} and not a.startswith("-")]
    parsed = OverridesParser.create().parse_overrides(rest)
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    experiments = [o for o in parsed if o.is_sweep_override() and o.key_or_group == "experiment"]
    slugs = list(experiments[0].sweep_string_iterator()) if experiments else [None]
    mappings = {}
    for slug in slugs:
        overrides = fixed + ([f"experiment={slug}"] if slug else [])
        cfg = _compose(overrides)
        name = slug or str(cfg.get("experiment_slug"))
        mappings[name] = tuple(learning_rate_keys(cfg.get("model"), name))
    if len(set(mappings.values())) > 1:
        raise SuiteError(
            f"{LR_ALIAS}: the swept experiments name their learning rate differently ("
            + "; ".join(f"{k}: model.{' + model.'.join(v)}" for k, v in mappings.items())
            + "); set those keys instead"
        )
    keys = next(iter(mappings.values()))
    if keys == ("lr",):
        return argv
    out = list(argv[:1])
    for i, arg in enumerate(args):
        match = dict(hits).get(i)
        if match is None:
            out.append(arg)
            continue
        plus, value = match.group(1), match.group(2)
        first = f"model.{keys[0]}"
        out += [f"{plus}{first}={value}", *(f"{plus}model.{k}=${{{first}}}" for k in keys[1:])]
    print(
        f"note: {LR_ALIAS} sets {' and '.join('model.' + k for k in keys)} (this experiment's learning rate)",
        file=sys.stderr,
        flush=True,
    )
    return out


def slurm_available(argv: list[str]) -> None:
    """``launcher=slurm`` (``make slurm``) where SLURM is not installed: one line, before Hydra makes a sweep folder
    (submitit's own report is a 50-line ``RuntimeError: Could not detect "srun"``)."""
    import shutil

    slurm = {"launcher=slurm", "hydra/launcher=submitit_slurm"}
    if slurm & set(argv[1:]) and shutil.which("srun") is None:
        raise SuiteError(
            "launcher=slurm: no SLURM on this machine (srun is not on PATH); run `make slurm` on a SLURM login "
            "node, or here without SLURM: make train / make sweep METHOD=<slug> ARGS=..."
        )


HELP_FLAGS = ("-h", "--help")


def training_groups(conf_dir: Path) -> set[str]:
    """The config groups a run composes: those the defaults lists of the entry configs (``conf/train.yaml``,
    ``conf/eval.yaml``) name (``data``, ``model``, ``trainer``, ``debug``, ...). Other folders of ``conf/`` hold
    files that are not run configs (``claim/``: the claim specs ``make claim`` reads)."""
    from omegaconf import DictConfig, OmegaConf

    groups: set[str] = set()
    for entry in sorted(conf_dir.glob("*.yaml")):
        for item in OmegaConf.load(entry).get("defaults", []):
            if isinstance(item, DictConfig):
                groups |= {str(key).split()[-1].strip("/").split("/")[0] for key in item}
    return groups


@contextlib.contextmanager
def training_groups_in_help() -> Iterator[None]:
    """``--help`` (and ``-h``, Hydra's short form) lists only the :func:`training_groups` under "Configuration
    groups": Hydra lists every folder of the config directory, the claim specs included."""
    from hydra._internal.hydra import Hydra

    groups = training_groups(Path(__file__).resolve().parents[1] / "conf")
    original = Hydra.format_config_groups

    def format_config_groups(self: Hydra, predicate: Callable[[str], bool], compact: bool = True) -> str:
        return original(self, lambda g: predicate(g) and g.split("/")[0] in groups | {"hydra"}, compact)

    Hydra.format_config_groups = format_config_groups  # type: ignore[method-assign]
    try:
        yield
    finally:
        Hydra.format_config_groups = original  # type: ignore[method-assign]


def run_main(hydra_main: Callable[[], object], resume: bool = False) -> None:
    """Call a ``@hydra.main`` function; print ``error: ...`` on one line and exit 2 for user errors.

    ``resume``: ``ckpt_path=last`` continues in the run folder it resumes from (:func:`resume_in_place`).
    """
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let exceptions reach us instead of Hydra's multi-line report
    try:
        slurm_available(sys.argv)
        if set(HELP_FLAGS) & set(sys.argv[1:]):
            with training_groups_in_help():
                hydra_main()
            return
        if resume:
            sys.argv = resume_in_place(learning_rate_alias(sys.argv))
        hydra_main()
    except SuiteError as err:
        fail(str(err))
    except (ConfigCompositionException, OverrideParseException, MissingConfigException) as err:
        fail(_config_hint(err))
    except (HydraException, OmegaConfBaseException) as err:
        fail(_config_hint(err))
    except Exception as err:
        # Launcher failures (e.g. sbatch refusing a job) are the user's to fix, not a traceback.
        if type(err).__module__.startswith("submitit"):
            fail(f"SLURM submission failed: {err}")
        raise
