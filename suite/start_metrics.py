"""The step-0 evaluation of a run: its validation metrics before any training (the weak-baseline rule of the claims).

``eval_at_start=true`` (every claim entry sets it, :func:`suite.claim.entry_command`) runs the validation loop once
on the untrained model before ``trainer.fit``: in a throwaway trainer built from the run's own ``trainer`` config
(same precision, accelerator and ``limit_val_batches``) with no logger, callbacks or checkpoints, and with every
random state saved before and restored after it, so the training that follows is the same with or without it. Its
``val/*`` values go to ``start_metrics.json`` in the run folder and, when the run finishes, into ``metrics.json``
as ``<key>@start`` (``val/loss@start``), where a claim page reads them (:func:`suite.report.baseline_checks`). A run
resumed from its checkpoint keeps the file its first start wrote; a fresh run in a reused folder replaces it.

No start is recorded (a warning says why, the run goes on) for a run on more than one process (each rank would
validate alone) or for a module that cannot validate before fitting; its claim page then reads "start not recorded".
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from core.smoke import smoke_test
from suite.build import instantiate, scalars
from suite.plumbing.smoke import SmokeMode
from suite.rundir import start_key

log = logging.getLogger(__name__)


@contextlib.contextmanager
def preserved_rng() -> Iterator[None]:
    """Save Python's, NumPy's and torch's (CPU and every CUDA device's) random states; restore them on exit."""
    py, npy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        random.setstate(py)
        np.random.set_state(npy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def evaluate_at_start(cfg: Any, model: Any, datamodule: Any, trainer: Any) -> dict[str, float]:
    """The ``val/*`` metrics of ``model`` before training, keyed ``<key>@start``; ``{}`` when none can be recorded.

    Args:
        cfg: the run's composed config (its ``trainer`` node builds the throwaway trainer).
        model: the LightningModule about to be fitted.
        datamodule: its datamodule.
        trainer: the run's own trainer (read only: world size, the debug flag).
    """
    # before fit a subprocess-launched DDP run may still report world size 1: count the devices it will use too
    processes = max(int(trainer.world_size), int(trainer.num_devices) * int(trainer.num_nodes))
    if processes > 1:
        log.warning("eval_at_start: not recorded on a run over %d processes", processes)
        return {}
    try:
        with preserved_rng():
            smoke = [SmokeMode()] if smoke_test(trainer) else []  # the run's smoke mode, not its other callbacks
            probe = instantiate(
                cfg.trainer,
                "trainer",
                callbacks=smoke,
                logger=False,
                enable_checkpointing=False,
                enable_progress_bar=False,
                enable_model_summary=False,
                devices=1,
                num_nodes=1,
                strategy="auto",
                inference_mode=False,  # no_grad: tensors the module keeps (metric states) stay usable in training
            )
            probe.validate(model, datamodule=datamodule, verbose=False)
            values = scalars(probe.callback_metrics)
    except Exception as err:  # noqa: BLE001 - a start that cannot be measured must never cost the run
        log.warning("eval_at_start: the untrained model could not be validated (%s: %s)", type(err).__name__, err)
        return {}
    return {start_key(k): v for k, v in values.items() if k.startswith("val/")}
