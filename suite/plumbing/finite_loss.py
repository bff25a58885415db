"""Stop a run the moment its training loss stops being finite, keeping the last good checkpoint."""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer

from core.errors import NonFiniteLossError


def _loss_value(outputs: Any, trainer: Trainer, key: str) -> float | None:
    if isinstance(outputs, torch.Tensor):
        return float(outputs.detach())
    if isinstance(outputs, dict) and isinstance(outputs.get("loss"), torch.Tensor):
        return float(outputs["loss"].detach())
    # Manual optimisation returns nothing: fall back to the logged training loss of this step.
    logged = trainer.callback_metrics.get(key)
    return None if logged is None else float(logged)


class FiniteLossGuard(Callback):
    """Raise :class:`NonFiniteLossError` naming the step when the training loss is NaN/inf.

    Lightning runs :class:`~lightning.pytorch.callbacks.ModelCheckpoint` hooks after all other callbacks, so the
    error is raised before the poisoned weights could be written; ``last.ckpt`` keeps the last finite state.

    The step named is the one at which the loss was computed: ``trainer.global_step`` read at the start of the
    batch, since by ``on_train_batch_end`` the optimizer step has already incremented it.

    Args:
        key: Logged metric used when ``training_step`` returns nothing (manual optimisation).
    """

    def __init__(self, key: str = "train/loss") -> None:
        self.key = key
        self._step_at_start: int | None = None

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._step_at_start = trainer.global_step

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        value = _loss_value(outputs, trainer, self.key)
        if value is None or math.isfinite(value):
            return
        step = trainer.global_step if self._step_at_start is None else self._step_at_start
        last = ""
        ckpt = getattr(trainer, "checkpoint_callback", None)
        if ckpt is not None and getattr(ckpt, "last_model_path", ""):
            last = f"; last good checkpoint: {ckpt.last_model_path}"
        raise NonFiniteLossError(
            f"training loss became {value} at global step {step} "
            f"(epoch {trainer.current_epoch}, batch {batch_idx}){last}"
        )
