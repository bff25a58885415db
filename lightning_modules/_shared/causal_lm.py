"""Causal language-model system shared by Gated DeltaNet, stick-breaking attention and their baselines.

The token mixer is chosen in the ``net`` config (:class:`layers.lm.CausalLM`), so one system trains GDN, DeltaNet,
Mamba2-style gating, softmax+RoPE / NoPE, sliding-window attention, stick-breaking and the hybrids.

Metrics (torchmetrics, keys ``stage/name``): ``loss`` (mean token cross-entropy over labelled positions),
``ppl = exp(loss)`` and ``acc`` (argmax accuracy on labelled positions: recall accuracy on the recall tasks, where
only answers are labelled). ``test`` runs one loader per context length of the datamodule's ``test_lengths`` and logs
``test/<name>_len<T>`` for each (plus ``test/<name>`` for the first), e.g. the stick-breaking protocol of training at
T=128 and evaluating at 128..1024.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
import torchmetrics
from torch import nn

from lightning_modules._base import OptimizerFactory, SchedulerFactory, SuiteLitModule

IGNORE = -100


class LMMetrics(nn.Module):
    """Token-weighted loss and accuracy means (``ppl`` is derived at compute time)."""

    def __init__(self) -> None:
        super().__init__()
        self.loss = torchmetrics.MeanMetric()
        self.acc = torchmetrics.MeanMetric()

    def update(self, loss: torch.Tensor, correct: torch.Tensor, count: torch.Tensor) -> None:
        n = count.clamp_min(1).float()
        self.loss.update(loss.detach(), weight=n)
        self.acc.update(correct.float() / n, weight=n)

    def compute(self) -> dict[str, torch.Tensor]:
        loss = self.loss.compute()
        return {"loss": loss, "ppl": loss.exp(), "acc": self.acc.compute()}

    def reset(self) -> None:
        self.loss.reset()
        self.acc.reset()


class TokenLMSteps:
    """Training and validation steps shared by the token-level LMs (causal LM here, the MiniLM masked-LM head): the
    host defines ``_step(batch) -> (loss, correct, count)`` and ``val_metrics`` (:class:`LMMetrics`)."""

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, correct, count = self._step(batch)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/acc", correct.float() / count.clamp_min(1))
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.val_metrics.update(*self._step(batch))

    def on_validation_epoch_end(self) -> None:
        for k, v in self.val_metrics.compute().items():
            self.log(f"val/{k}", v, prog_bar=k == "loss")
        self.val_metrics.reset()


class CausalLMLitModule(TokenLMSteps, SuiteLitModule):
    """Next-token training of a :class:`layers.lm.CausalLM`.

    Args:
        net: The language model (``input_ids [B, T] -> logits [B, T, V]``).
        optimizer: Optimiser partial (AdamW in the configs).
        scheduler: Scheduler partial or ``None``.
        scheduler_interval: ``step`` or ``epoch``.
        no_decay_1d: Put 1-D parameters (norms, biases) and parameters marked ``_no_weight_decay`` (GDN's
            ``A_log``, ``dt_bias``) in a group with ``weight_decay=0``, as the NVlabs/fla recipes do.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: str = "step",
        no_decay_1d: bool = True,
    ) -> None:
        super().__init__(optimizer, scheduler, scheduler_interval, monitor="val/loss")
        self.save_hyperparameters(ignore=["net", "optimizer", "scheduler"])
        self.net = net
        self.no_decay_1d = no_decay_1d
        self.val_metrics = LMMetrics()
        self.test_metrics = nn.ModuleList()
        self.test_lengths: list[int] = []

    def trainable_parameters(self) -> Iterable[Any]:
        decay, no_decay = [], []
        for p in self.parameters():
            if not p.requires_grad:
                continue
            skip = getattr(p, "_no_weight_decay", False) or (self.no_decay_1d and p.dim() < 2)
            (no_decay if skip else decay).append(p)
        return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}] if no_decay else decay

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.net(input_ids)

    def _step(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self(batch["input_ids"])
        labels = batch["labels"]
        loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE)
        mask = labels != IGNORE
        correct = ((logits.argmax(-1) == labels) & mask).sum()
        return loss, correct, mask.sum()

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        lengths = list(getattr(dm, "test_lengths", None) or [0])
        if lengths != self.test_lengths:
            self.test_lengths = lengths
            self.test_metrics = nn.ModuleList([LMMetrics() for _ in lengths])

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        self.test_metrics[dataloader_idx].update(*self._step(batch))

    def on_test_epoch_end(self) -> None:
        for i, (length, metrics) in enumerate(zip(self.test_lengths, self.test_metrics)):
            for k, v in metrics.compute().items():
                if length:
                    self.log(f"test/{k}_len{length}", v, add_dataloader_idx=False)
                if i == 0:
                    self.log(f"test/{k}", v, add_dataloader_idx=False)
            metrics.reset()
