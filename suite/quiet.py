"""Silence what is noise to a user at the suite's entry points; real warnings still show.

Every filter below names one message; there is no blanket ``warnings.simplefilter("ignore")``.
"""

from __future__ import annotations

import logging
import re
import warnings

# Informational lines of Lightning that say nothing about this run, or that the suite says better itself.
_NOISE_LOGS = (
    r"💡 Tip: ",  # litlogger / litmodels advertisements
    r"`Trainer\(limit_(train|val|test|predict)_batches=1\.0\)` was configured",  # the default, echoed
    r"`weights_only` was not set, defaulting to `False`",  # about *saving* a full training checkpoint
    r"Received SIGTERM: ",  # the suite prints what it did about it (checkpoint + resume command)
    r"Bypassing SIGTERM: ",
    r"Images sizes do not match",  # wandb (root logger) on a list of plots of different sizes: they are separate plots
)
# Warnings from libraries about their own internals or about settings the suite chose on purpose.
_NOISE_WARNINGS = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning vs torch pytree internals
    r"The `srun` command is available on your system but is not used",  # local runs on a SLURM login node
    r"You requested to overfit but enabled (train|val|test) dataloader shuffling",  # debug=overfit, by design
    r"The dirpath has changed from",  # ModelCheckpoint on a resume from another folder's checkpoint
    r"Experiment logs directory .* exists and is not empty",  # resume in the same folder (suite.loggers)
    r"Checkpoint directory .* exists and is not empty",  # same: last.ckpt is overwritten on purpose
    r"`torch\.jit\.script` is deprecated",  # torch_geometric scripts its own helpers at import time
)

# Lightning's DDP advice "use `self.log(<key>, ..., sync_dist=True)`" for values that are already the same on every
# rank when they are logged: only these keys, each with why it holds; the advice stays for every other key (a
# per-shard validation loss is a rank's own number).
_SYNCED_ANYWAY = (
    # callbacks/tta.py sums the ranks' counts (callbacks.distributed.sum_over_ranks) before it logs these
    r"tta/acc_q\d+|tta/selected|tta/resets|tta/param_shift",
    # callbacks/quant_calibration.py and quant_classifier.py calibrate and score on the ranks' pooled batches
    # (callbacks.distributed.gather_batches / sum_over_ranks): every rank logs the one-process value
    r"quant/[^']+",
)
_SYNC_DIST_ADVICE = r"It is recommended to use `self\.log\('(?:{keys})', \.\.\., sync_dist=True\)`"


class _DropMessages(logging.Filter):
    def __init__(self, patterns: tuple[str, ...]) -> None:
        super().__init__()
        self.pattern = re.compile("|".join(f"(?:{p})" for p in patterns))

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.pattern.search(record.getMessage())


_FILTER = _DropMessages(_NOISE_LOGS)


def quiet_console() -> None:
    """Install the filters (idempotent). Lightning's own console handler is removed when Hydra's root handler is
    there, so each INFO line is printed once (console and the run's ``<task>.log``) instead of twice."""
    root = logging.getLogger()
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if root.handlers and type(handler) is logging.StreamHandler:
                logger.removeHandler(handler)
                logger.propagate = True
            elif _FILTER not in handler.filters:
                handler.addFilter(_FILTER)
    for handler in root.handlers:
        if _FILTER not in handler.filters:
            handler.addFilter(_FILTER)
    for pattern in _NOISE_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    warnings.filterwarnings("ignore", message=_SYNC_DIST_ADVICE.format(keys="|".join(_SYNCED_ANYWAY)))
