"""Lightning's ``ModelCheckpoint`` whose ``last.ckpt`` is always the state training ended in."""

from __future__ import annotations

import re
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint


def epoch_filename(monitor: str | None) -> str:
    """The file name template of the epoch checkpoints: ``epoch_{epoch:03d}``, followed by the monitored metric and
    its value when there is one (``epoch_007-val_r2_0.4123.ckpt`` for ``monitor=val/r2``). The metric's ``/`` is
    written ``_`` (a ``/`` would make a subfolder) and no ``=`` is written: Hydra's override grammar refuses an
    unquoted ``=`` in a value, so ``make eval CKPT=<file>`` takes the name as it is."""
    if not monitor:
        return "epoch_{epoch:03d}"
    name = re.sub(r"[^\w.-]", "_", monitor)
    return f"epoch_{{epoch:03d}}-{name}_{{{monitor}:.4f}}"


class FinalStateCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` that also writes ``last.ckpt`` when ``fit`` ends, whatever the validation interval.

    Lightning writes ``last.ckpt`` beside each top-k checkpoint, i.e. after a validation, and at the end of
    training only when none was written before. A step budget that is not a multiple of ``val_check_interval``
    (440 steps, validated every 200) then leaves ``last.ckpt`` at step 400 while the run tests, and a method's
    test-time analysis (quantization calibration, an outlier census) measures, the step-440 weights: ``make eval`` on
    ``last.ckpt`` would score other weights than the run reported, and a larger budget would resume 40 steps back.
    Here ``on_train_end`` writes ``last.ckpt`` unless it already holds the final step. Not under ``fast_dev_run``
    (debug runs write no checkpoint), and not when training stopped on an exception (SIGTERM and Ctrl-C write theirs
    in ``CheckpointOnSigterm``; a NaN loss keeps the last good one): Lightning calls ``on_train_end`` only when the
    loop ends normally.

    Takes every argument of :class:`~lightning.pytorch.callbacks.ModelCheckpoint`; without a ``filename`` the epoch
    checkpoints are named by :func:`epoch_filename` (the epoch, and the monitored metric with its value).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not args and kwargs.get("filename") is None:
            kwargs["filename"] = epoch_filename(kwargs.get("monitor"))
        super().__init__(*args, **kwargs)
        self._last_saved_step: int | None = None

    @property
    def state_key(self) -> str:
        """``ModelCheckpoint``'s own key: checkpoints written before or by either class restore into the other (a
        resumed run keeps its best-model path), and ``make eval``'s plain trainer recognises the state."""
        return ModelCheckpoint.state_key.fget(self).replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def _save_last_checkpoint(self, trainer: Trainer, monitor_candidates: dict[str, Any]) -> None:
        super()._save_last_checkpoint(trainer, monitor_candidates)
        if self.save_last:
            self._last_saved_step = trainer.global_step

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        if not self.save_last or trainer.fast_dev_run or self._last_saved_step == trainer.global_step:
            return
        self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
