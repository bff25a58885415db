"""What a claim's entries need before any of them starts: a CUDA device when an entry asks for a GPU, the real
dataset's folder when it reads one, and the packages its config's ``_target_`` classes import.

``make claim METHOD=x PROFILE=paper`` on a machine without a GPU used to start every entry, watch each fail after
about ten seconds and write an empty page; :func:`preflight` composes each entry's config as its run will (without
its seed sweep) and names everything missing in one line before anything runs.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

import suite.resolvers  # noqa: F401 - registers the resolvers the composed configs use

ROOT = Path(__file__).resolve().parents[1]


def _targets(node: Any) -> list[str]:
    out: list[str] = []
    if isinstance(node, DictConfig):
        for key in node:
            try:
                child = node[key]
            except Exception:  # noqa: BLE001 - an unresolvable value is the run's to report
                continue
            if key == "_target_" and isinstance(child, str):
                out.append(child)
            else:
                out += _targets(child)
    elif OmegaConf.is_list(node):
        for child in node:
            out += _targets(child)
    return out


def _missing_package(target: str) -> str | None:
    """The package a ``_target_`` cannot import (``No module named 'fla'``), or None when it imports."""
    module = target.rsplit(".", 1)[0]
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        return err.name or module
    except ImportError as err:
        return f"{module} ({err})"
    return None


def entry_problems(cfg: DictConfig, cuda_devices: int) -> list[str]:
    """What one composed run config needs that this machine lacks (empty when nothing)."""
    problems = []
    trainer = cfg.get("trainer") or {}
    accelerator = str(trainer.get("accelerator", "auto"))
    if accelerator in ("gpu", "cuda"):
        devices = trainer.get("devices", 1)
        wanted = int(devices) if isinstance(devices, int) or str(devices).isdigit() else 1
        if cuda_devices == 0:
            problems.append(f"a GPU (trainer.accelerator={accelerator}) but CUDA finds no device here")
        elif wanted > cuda_devices:
            problems.append(f"trainer.devices={wanted} GPUs but CUDA finds {cuda_devices}")
    data = cfg.get("data") or {}
    if str(data.get("source", "")) == "real" and data.get("data_dir") is not None:
        data_dir = Path(str(data.get("data_dir")))
        if not data_dir.is_absolute():
            data_dir = ROOT / data_dir
        if not data_dir.exists():
            problems.append(f"its dataset folder data.data_dir={data_dir} (data.source=real), which does not exist")
    for target in dict.fromkeys(_targets(cfg)):
        missing = _missing_package(target)
        if missing:
            problems.append(f"the package '{missing}' (for {target}), which is not installed")
    return problems


def compose_run(slug: str, overrides: list[str]) -> DictConfig:
    """The ``train`` config one job of the entry gets: its sweeps (seeds) pinned to their first value; the experiment
    is ``slug`` unless ``overrides`` choose one (``experiment=...``, an entry's own)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    pinned = []
    for o in parsed:
        if o.key_or_group.startswith("hydra.") and o.key_or_group != "hydra.searchpath":
            continue
        pinned.append(
            f"{o.get_key_element()}={next(iter(o.sweep_string_iterator()))}" if o.is_sweep_override() else o.input_line
        )
    if not any(o.startswith("experiment=") for o in pinned):  # an entry's own experiment comes first in overrides
        pinned = [f"experiment={slug}", *pinned]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose("train", overrides=pinned)


def cuda_device_count() -> int:
    """CUDA devices, counted through NVML: the claim process itself never initialises CUDA (its runs do; many
    claim processes share one GPU under MPS)."""
    import torch

    saved = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    finally:
        if saved is None:
            os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK")
        else:
            os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = saved


def preflight(slug: str, entries: dict[str, list[str]]) -> str | None:
    """One line naming what the entries (name -> their run's overrides) need and this machine lacks, or None."""
    cuda = cuda_device_count()
    by_problem: dict[str, list[str]] = {}
    for name, overrides in entries.items():
        for problem in entry_problems(compose_run(slug, overrides), cuda):
            by_problem.setdefault(problem, []).append(name)
    if not by_problem:
        return None
    parts = []
    for problem, names in by_problem.items():
        who = f"entry {names[0]}" if len(names) == 1 else f"{len(names)} entries ({', '.join(names)})"
        parts.append(f"{who} need{'s' * (len(names) == 1)} {problem}")
    return f"not starting the {slug} claim: " + "; ".join(parts) + " (nothing was run)"
