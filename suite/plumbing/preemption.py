"""Save ``last.ckpt`` when the process is asked to stop (SIGTERM), so ``ckpt_path=last`` resumes mid-epoch."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException


class CheckpointOnSigterm(Callback):
    """On SIGTERM, Lightning stops after the current batch; this writes ``<dirpath>/last.ckpt`` at that point.

    Unlike Lightning's ``OnExceptionCheckpoint`` it ignores every other exception, so a NaN loss or a crash never
    overwrites the last good checkpoint. Together with the suite's resumable loaders
    (:mod:`datamodules._base`) a restarted run continues at the very next batch.

    Args:
        dirpath: Checkpoint folder (the run's ``checkpoints/``).
        filename: File name of the checkpoint.
    """

    # Like ModelCheckpoint's flag: a *full* training checkpoint (optimizer, loops, loader positions) is written, which
    # still loads with ``torch.load(weights_only=True)``; passing it explicitly keeps Lightning from logging that it
    # "defaulted" the setting.
    save_weights_only = False

    def __init__(self, dirpath: str, filename: str = "last.ckpt") -> None:
        self.path = Path(dirpath) / filename

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException):
            trainer.save_checkpoint(str(self.path), weights_only=self.save_weights_only)
