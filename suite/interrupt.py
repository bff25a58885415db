"""Ctrl-C (SIGINT) stops a training run the way SIGTERM does: at the end of the current batch, with ``last.ckpt``.

Lightning turns SIGINT into a ``KeyboardInterrupt`` raised wherever the main thread happens to be (inside an
optimizer step, a data loader, a collective), then tears down and exits 1: no checkpoint, no resume hint, and the
README's next step (``ckpt_path=last``) would find only older runs. Here the first SIGINT during ``fit`` sets the
flag Lightning's own SIGTERM handler sets, so the loop stops after the batch, ``CheckpointOnSigterm`` writes
``last.ckpt`` and the runner prints the resume command and exits 130 (128 + SIGINT). A second Ctrl-C (more than a
second later: a DDP launcher relays the first one to its workers at once) is Python's ``KeyboardInterrupt`` again,
for a run that does not come back from its batch.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType, TracebackType
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

INTERRUPTED_EXIT_CODE = 130
"""Exit status of a run stopped by Ctrl-C after writing ``last.ckpt``: 128 + SIGINT, as shells report it."""

_RELAY_S = 1.0


class SigintAsSigterm:
    """Context manager around ``trainer.fit``: SIGINT sets Lightning's ``received_sigterm`` (see the module).

    Args:
        trainer: The trainer about to fit.
    """

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.received_at: float | None = None
        self._old: Any = None
        self._installed = False

    @property
    def received(self) -> bool:
        """Whether a SIGINT stopped (or is stopping) this fit."""
        return self.received_at is not None

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.received_at is not None:
            if time.monotonic() - self.received_at > _RELAY_S:
                raise KeyboardInterrupt
            return
        self.received_at = time.monotonic()
        # Lightning's own SIGTERM path: relays the signal to launched workers, tells the other ranks, sets the flag
        self.trainer._signal_connector._sigterm_notifier_fn(signum, frame)

    def __enter__(self) -> SigintAsSigterm:
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread only
            self._old = signal.signal(signal.SIGINT, self._handler)
            self._installed = True
            self.trainer.callbacks.append(_KeepFlag(self))
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._old if self._old is not None else signal.default_int_handler)
            self._installed = False


class _KeepFlag(Callback):
    """Lightning clears ``received_sigterm`` when it installs its handlers at the start of ``fit``; a Ctrl-C that
    came during setup (data, model) must still stop the run, at its first batch."""

    def __init__(self, owner: SigintAsSigterm) -> None:
        super().__init__()
        self.owner = owner

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.owner.received:
            trainer._signal_connector.received_sigterm = True
