"""The composed config as a tree at the start of a run (``print_config: true`` in ``conf/train.yaml``)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, ListConfig, OmegaConf
from rich.console import Console
from rich.syntax import Syntax
from rich.tree import Tree

#: Top-level groups printed first, in this order; the other groups follow in the config's order, then one ``run``
#: branch with the top-level values (seed, tags, task_name, ...).
ORDER = ("data", "model", "callbacks", "logger", "trainer", "paths")


def _yaml(node: DictConfig | dict) -> str:
    """``node`` as YAML with its interpolations resolved; as written where one does not resolve."""
    if isinstance(node, dict):
        return OmegaConf.to_yaml(OmegaConf.create(node)).rstrip() if node else "{}"
    try:
        return OmegaConf.to_yaml(node, resolve=True).rstrip()
    except Exception:  # noqa: BLE001 - the run itself reports a bad value; the tree shows it as written
        return OmegaConf.to_yaml(node, resolve=False).rstrip()


def _run_values(cfg: DictConfig) -> dict:
    """The top-level values that are not groups, resolved where they resolve."""
    out = {}
    for key in cfg:
        node = cfg._get_node(str(key))
        if isinstance(node, DictConfig):
            continue
        try:
            value = cfg[key]
        except Exception:  # noqa: BLE001 - as written (see _yaml)
            value = node._value()
        out[str(key)] = OmegaConf.to_container(value) if isinstance(value, ListConfig) else value
    return out


def _syntax(text: str) -> Syntax:
    return Syntax(text, "yaml", theme="ansi_dark", background_color="default", word_wrap=True)


def config_tree(cfg: DictConfig, order: Sequence[str] = ORDER) -> Tree:
    """A :class:`rich.tree.Tree` of ``cfg``: one branch per group (``data``, ``model``, ...) holding its YAML."""
    groups = [k for k in order if isinstance(cfg.get(k), DictConfig)]
    groups += [str(k) for k in cfg if str(k) not in groups and isinstance(cfg._get_node(str(k)), DictConfig)]
    tree = Tree("config", style="bold", guide_style="dim")
    for key in groups:
        tree.add(key, style="bold").add(_syntax(_yaml(cfg[key])))
    tree.add("run", style="bold").add(_syntax(_yaml(_run_values(cfg))))
    return tree


def print_config_tree(cfg: DictConfig, file: TextIO | None = None) -> bool:
    """Print :func:`config_tree` of ``cfg`` once per run: in the process of global rank 0 only (a DDP or SLURM
    task of another rank prints nothing); returns whether it printed. Long lines wrap in a terminal and are kept
    whole where the output is not one (a log file, a pipe), not cut at 80 columns."""
    if getattr(rank_zero_only, "rank", 0) != 0:
        return False
    out = file or sys.stdout
    console = Console(file=out, width=None if out.isatty() else 10_000, soft_wrap=False)
    console.print(config_tree(cfg))
    out.flush()
    return True
