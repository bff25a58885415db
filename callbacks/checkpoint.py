"""Lightning's ``ModelCheckpoint`` whose ``last.ckpt`` is always the state training ended in."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint


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

    Takes every argument of :class:`~lightning.pytorch.callbacks.ModelCheckpoint`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
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
