"""The suite's progress bar: Lightning's rich bar, redrawn at a human rate instead of once per batch."""

from __future__ import annotations

import time
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import RichProgressBar


class ThrottledRichProgressBar(RichProgressBar):
    """:class:`~lightning.pytorch.callbacks.RichProgressBar` whose per-batch work (bar position, the metrics column,
    the redraw request) runs at most ``refresh_rate`` times a second, and whose redraw thread runs at that rate.

    Lightning's rich bar updates its position and recomputes the shown metrics after every training batch and redraws
    up to ``refresh_rate`` (default 100) times a second on a thread that competes with training for the GIL: on a
    small model that was ~1.4 ms of a ~6 ms step (``benchmarks/overhead.py``). At 10 redraws a second (the rate tqdm
    uses by default) the bar looks the same; a batch whose update is skipped is drawn by the next one that is due and
    the last batch of an epoch, the end of the epoch and the start of validation always draw, so the bar never ends
    short of where training stopped.

    Args:
        refresh_rate: Redraws per second (0 hides the bar, as in Lightning).
        **kwargs: :class:`RichProgressBar`'s other arguments (``leave``, ``theme``, ``console_kwargs``).
    """

    def __init__(self, refresh_rate: int = 10, **kwargs: Any) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self._last_draw = float("-inf")
        self._pending: tuple[Any, ...] | None = None

    def _due(self, batch_idx: int, total: float) -> bool:
        now = time.monotonic()
        if batch_idx + 1 >= total or now - self._last_draw >= 1.0 / self.refresh_rate:
            self._last_draw = now
            return True
        return False

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if (
            self.is_enabled
            and self.train_progress_bar_id is not None
            and not self._due(batch_idx, self.total_train_batches)
        ):
            self._pending = (trainer, pl_module, outputs, batch, batch_idx)
            return
        self._pending = None
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def _draw_pending(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            super().on_train_batch_end(*pending)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._draw_pending()
        super().on_train_epoch_end(trainer, pl_module)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._draw_pending()
        super().on_validation_start(trainer, pl_module)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._draw_pending()
        super().on_train_end(trainer, pl_module)
