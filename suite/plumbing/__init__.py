"""The runner's own callbacks: the composed config in every checkpoint, ``last.ckpt`` on SIGTERM, the progress bar,
the non-finite loss guard, step timing and smoke mode. They serve the runner, not a paper; ``conf/callbacks/``
names them by their ``suite.plumbing.*`` targets."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, read_write

MOVED_TARGETS = {
    "callbacks.run_config.ConfigInCheckpoint": "suite.plumbing.run_config.ConfigInCheckpoint",
    "callbacks.preemption.CheckpointOnSigterm": "suite.plumbing.preemption.CheckpointOnSigterm",
    "callbacks.progress.ThrottledRichProgressBar": "suite.plumbing.progress.ThrottledRichProgressBar",
    "callbacks.finite_loss.FiniteLossGuard": "suite.plumbing.finite_loss.FiniteLossGuard",
    "callbacks.step_timer.StepTimer": "suite.plumbing.step_timer.StepTimer",
}
"""The ``_target_`` a config saved by an earlier version of the suite names for each runner callback (in a run
folder's ``.hydra/config.yaml``), and where that callback lives now."""

MOVED_MODULES = {
    "lightning_modules.causal_lm": "lightning_modules._shared.causal_lm",
    "lightning_modules.diffusion": "lightning_modules._shared.diffusion",
    "lightning_modules.minilm_mlm": "lightning_modules.ostquant.minilm_mlm",
}
"""Modules of a paper's system that a config saved by an earlier version of the suite names in its ``model:`` node
(``lightning_modules.causal_lm.CausalLMLitModule``), and where they live now. The papers that became folders kept
their module path (``lightning_modules.grass.GrassLitModule`` is the package's export)."""


def moved_target(target: str) -> str:
    """Where the object a saved ``_target_`` names lives now: ``target`` itself unless it moved."""
    if target in MOVED_TARGETS:
        return MOVED_TARGETS[target]
    module, _, name = target.rpartition(".")
    return f"{MOVED_MODULES[module]}.{name}" if module in MOVED_MODULES else target


def update_moved_targets(node: Any) -> None:
    """Point every ``_target_`` in ``node`` (a config node, searched at any depth: the ``callbacks`` group, a
    ``model`` with its nested ``net``) that names a moved object (:data:`MOVED_TARGETS`, :data:`MOVED_MODULES`) at
    its current place, in place, so a run folder or checkpoint saved before the move still builds and resumes."""
    if isinstance(node, DictConfig):
        keys = list(node.keys())
    elif isinstance(node, ListConfig):
        keys = list(range(len(node)))
    else:
        return
    with read_write(node):
        for key in keys:
            if OmegaConf.is_missing(node, key) or OmegaConf.is_interpolation(node, key):
                continue
            value = node[key]
            if key == "_target_" and isinstance(value, str) and moved_target(value) != value:
                node[key] = moved_target(value)
            else:
                update_moved_targets(value)
