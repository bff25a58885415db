"""The runner's own callbacks: the composed config in every checkpoint, ``last.ckpt`` on SIGTERM, the progress bar,
the non-finite loss guard, step timing and smoke mode. They serve the runner, not a paper; ``conf/callbacks/``
names them by their ``suite.plumbing.*`` targets."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, read_write

MOVED_TARGETS = {
    "callbacks.run_config.ConfigInCheckpoint": "suite.plumbing.run_config.ConfigInCheckpoint",
    "callbacks.preemption.CheckpointOnSigterm": "suite.plumbing.preemption.CheckpointOnSigterm",
    "callbacks.progress.ThrottledRichProgressBar": "suite.plumbing.progress.ThrottledRichProgressBar",
    "callbacks.finite_loss.FiniteLossGuard": "suite.plumbing.finite_loss.FiniteLossGuard",
    "callbacks.step_timer.StepTimer": "suite.plumbing.step_timer.StepTimer",
}
"""The ``_target_`` a config saved by an earlier version of the suite names for each runner callback (in a run
folder's ``.hydra/config.yaml``), and where that callback lives now."""


def update_moved_targets(callbacks: Any) -> None:
    """Point every callback of ``callbacks`` (the config's ``callbacks`` node) whose ``_target_`` is a
    :data:`MOVED_TARGETS` key at the callback's current place, in place, so a run folder saved before the runner's
    callbacks moved still builds and resumes."""
    if not isinstance(callbacks, DictConfig):
        return
    with read_write(callbacks):
        for node in callbacks.values():
            if isinstance(node, DictConfig) and str(node.get("_target_", "")) in MOVED_TARGETS:
                node._target_ = MOVED_TARGETS[str(node._target_)]
