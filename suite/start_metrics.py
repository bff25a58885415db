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
import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

START = "@start"
START_FILE = "start_metrics.json"


def start_key(key: str) -> str:
    """The ``metrics.json`` key of ``key``'s step-0 value: ``val/loss`` -> ``val/loss@start``."""
    return f"{key}{START}"


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
    from suite.run import _scalars, instantiate

    # before fit a subprocess-launched DDP run may still report world size 1: count the devices it will use too
    processes = max(int(trainer.world_size), int(trainer.num_devices) * int(trainer.num_nodes))
    if processes > 1:
        log.warning("eval_at_start: not recorded on a run over %d processes", processes)
        return {}
    try:
        with preserved_rng():
            probe = instantiate(
                cfg.trainer, "trainer", callbacks=[], logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, devices=1, num_nodes=1, strategy="auto",
                inference_mode=False,  # no_grad: tensors the module keeps (metric states) stay usable in training
            )  # fmt: skip
            probe.suite_smoke = getattr(trainer, "suite_smoke", False)
            probe.validate(model, datamodule=datamodule, verbose=False)
            values = _scalars(probe.callback_metrics)
    except Exception as err:  # noqa: BLE001 - a start that cannot be measured must never cost the run
        log.warning("eval_at_start: the untrained model could not be validated (%s: %s)", type(err).__name__, err)
        return {}
    return {start_key(k): v for k, v in values.items() if k.startswith("val/")}


def write_start(run_dir: Path, metrics: dict[str, float]) -> None:
    """Write ``start_metrics.json`` (an empty dict removes it: a fresh run never keeps an earlier run's start)."""
    path = Path(run_dir) / START_FILE
    if metrics:
        path.write_text(json.dumps(metrics, indent=2, sort_keys=True))
    else:
        path.unlink(missing_ok=True)


def read_start(run_dir: Path) -> dict[str, float]:
    """The ``<key>@start`` values a run's step-0 evaluation wrote (``{}`` when there is none or it is unreadable)."""
    try:
        data = json.loads((Path(run_dir) / START_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)} if isinstance(data, dict) else {}
