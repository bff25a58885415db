"""What every suite LightningModule shares: optimiser/scheduler partials and metric collections.

Optimisers come from the config as partials (``_partial_: true``), so a model config reads

```yaml
optimizer: {_target_: torch.optim.AdamW, _partial_: true, lr: 1e-3}
scheduler: {_target_: torch.optim.lr_scheduler.CosineAnnealingLR, _partial_: true, T_max: 100}
```
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torchmetrics
from lightning.pytorch import LightningModule

from core.errors import ConfigError

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


class SuiteLitModule(LightningModule):
    """Base LightningModule.

    Args:
        optimizer: Partial that takes the parameters (``None`` for modules that optimise by hand).
        scheduler: Partial that takes the optimiser, or ``None``.
        scheduler_interval: ``step`` or ``epoch``.
        monitor: Metric a ``ReduceLROnPlateau`` scheduler watches.
    """

    def __init__(
        self,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: str = "step",
        monitor: str = "val/loss",
    ) -> None:
        super().__init__()
        if scheduler_interval not in ("step", "epoch"):
            raise ConfigError(f"model.scheduler_interval={scheduler_interval!r} must be 'step' or 'epoch'")
        if scheduler is not None and optimizer is None:
            raise ConfigError("model.scheduler needs model.optimizer")
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.scheduler_interval = scheduler_interval
        self.monitor = monitor

    def trainable_parameters(self) -> Iterable[torch.nn.Parameter]:
        """Parameters handed to the optimiser (override for parameter groups)."""
        return [p for p in self.parameters() if p.requires_grad]

    def configure_optimizers(self) -> Any:
        if self.optimizer_factory is None:
            return None
        try:
            optimizer = self.optimizer_factory(self.trainable_parameters())
        except (TypeError, ValueError) as err:
            raise ConfigError(f"model.optimizer: {err}") from None
        if self.scheduler_factory is None:
            return optimizer
        try:
            scheduler = self.scheduler_factory(optimizer)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"model.scheduler: {err}") from None
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": self.scheduler_interval, "monitor": self.monitor},
        }


def classification_metrics(num_classes: int, stage: str) -> torchmetrics.MetricCollection:
    """Accuracy and macro-F1 with keys ``<stage>/acc`` and ``<stage>/f1`` (torchmetrics' binary task for 2 classes:
    feed logits through :func:`metric_inputs`, or pass predicted labels)."""
    task = "binary" if num_classes == 2 else "multiclass"
    return torchmetrics.MetricCollection(
        {
            "acc": torchmetrics.Accuracy(task=task, num_classes=num_classes),
            "f1": torchmetrics.F1Score(task=task, num_classes=num_classes, average="macro"),
        },
        prefix=f"{stage}/",
    )


def metric_inputs(logits: torch.Tensor, num_classes: int) -> torch.Tensor:
    """What the suite's classification metrics take: logits ``[B, K]``, or for ``K = 2`` (torchmetrics' *binary*
    task, which wants one score per image) the positive class's probability ``[B]``, so ``p > 0.5`` is the argmax."""
    if logits.dim() != 2 or logits.shape[1] != num_classes:
        raise ConfigError(f"logits of shape {list(logits.shape)} do not have num_classes={num_classes} columns")
    return torch.softmax(logits, 1)[:, 1] if num_classes == 2 else logits


def regression_metrics(stage: str) -> torchmetrics.MetricCollection:
    """MAE, MSE and R^2 with keys ``<stage>/mae``, ``<stage>/mse``, ``<stage>/r2``."""
    return torchmetrics.MetricCollection(
        {
            "mae": torchmetrics.MeanAbsoluteError(),
            "mse": torchmetrics.MeanSquaredError(),
            "r2": torchmetrics.R2Score(),
        },
        prefix=f"{stage}/",
    )
