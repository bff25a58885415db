"""SuMi's source model: a two-modality (audio + video) classifier trained on clean data.

Guo & Jin, "Smoothing the Shift: Towards Stable Test-Time Adaptation under Complex Multimodal Noises", ICLR 2025.
The paper adapts a CAV-MAE model fine-tuned on Kinetics50 / VGGSound at test time; this module is that source
model in miniature (:class:`layers.multimodal.AudioVisualTransformer`: per-modality transformer blocks, one fusion
block, unimodal modes with zero placeholders). It is trained here on clean pairs with

    L = CE(z_mm, y) + w_u (CE(z_a, y) + CE(z_v, y)) / 2,

where ``z_a``/``z_v`` are the unimodal passes (CAV-MAE learns its modality-specific fusion norms during
pre-training; a model trained from scratch needs this term for SuMi's unimodal entropies to mean anything), and
with modality dropout (a sample's audio or video tokens replaced by zeros with probability ``modality_dropout``).

Test-time adaptation is not in this module: ``callbacks.tta.TestTimeAdaptation`` adapts any classification module
during ``trainer.test``. This module exposes what the multimodal strategies need through :meth:`tta_forward`.
Batches are ``((audio [B, T, F], video [B, C, H, W]), y [B])``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import torchmetrics

from core.errors import ConfigError
from layers.multimodal import AudioVisualTransformer
from lightning_modules._base import OptimizerFactory, SchedulerFactory, SuiteLitModule, classification_metrics


class SumiLitModule(SuiteLitModule):
    """Audio-visual source classifier; adapted at test time by the TTA callback.

    Args:
        net: The audio-visual transformer.
        num_classes: ``C`` (must match ``net``).
        modality_dropout: Probability that a training sample loses one modality (zero tokens).
        unimodal_weight: ``w_u`` of the unimodal cross-entropy terms.
        optimizer, scheduler: Hydra partials (see ``SuiteLitModule``).
    """

    def __init__(
        self,
        net: AudioVisualTransformer,
        num_classes: int,
        modality_dropout: float = 0.2,
        unimodal_weight: float = 0.5,
        optimizer: OptimizerFactory | None = None,
        scheduler: SchedulerFactory | None = None,
    ) -> None:
        super().__init__(optimizer=optimizer, scheduler=scheduler, monitor="val/acc")
        if not 0.0 <= modality_dropout < 1.0:
            raise ConfigError(f"model.modality_dropout={modality_dropout} must be in [0, 1)")
        if unimodal_weight < 0:
            raise ConfigError(f"model.unimodal_weight={unimodal_weight} must be >= 0")
        head_out = net.head[-1].out_features
        if head_out != num_classes:
            raise ConfigError(f"model.num_classes={num_classes} must equal model.net.num_classes={head_out}")
        self.save_hyperparameters(ignore=["net", "optimizer", "scheduler"])
        self.net = net
        self.num_classes = num_classes
        self.modality_dropout = modality_dropout
        self.unimodal_weight = unimodal_weight
        self.train_metrics = classification_metrics(num_classes, "train")
        self.val_metrics = classification_metrics(num_classes, "val")
        self.test_metrics = classification_metrics(num_classes, "test")
        # per-modality source accuracy on clean validation pairs (the unimodal passes SuMi's entropies come from)
        task = "binary" if num_classes == 2 else "multiclass"
        self.val_uni = torch.nn.ModuleDict(
            {m: torchmetrics.Accuracy(task=task, num_classes=num_classes) for m in ("audio", "video")}
        )

    # -- inference -------------------------------------------------------------------------------------------------
    def forward(self, x: tuple[torch.Tensor | None, torch.Tensor | None]) -> torch.Tensor:
        """Multimodal logits ``[B, C]`` of ``x = (audio, video)``; a ``None`` modality uses the unimodal mode."""
        a, v = x
        return self.net(a, v, "multimodal")

    def tta_forward(self, x: tuple[torch.Tensor | None, torch.Tensor | None]) -> dict[str, torch.Tensor | None]:
        """The three passes SuMi uses, sharing the modality-specific encoders.

        Returns:
            ``logits`` (multimodal ``[B, C]``), ``logits_a``/``logits_v`` (audio-/video-only ``[B, C]``) and
            ``feat_a``/``feat_v`` (token means after the modality-specific blocks, ``[B, D]``); entries of a
            modality missing from the batch (``None``) are ``None``.
        """
        a, v = x
        tok_a = self.net.encode_audio(a) if a is not None else None
        tok_v = self.net.encode_video(v) if v is not None else None
        both = tok_a is not None and tok_v is not None
        return {
            "logits": self.net.fuse(tok_a, tok_v, "multimodal") if both else self.forward(x),
            "logits_a": self.net.fuse(tok_a, None, "audioonly") if tok_a is not None else None,
            "logits_v": self.net.fuse(None, tok_v, "videoonly") if tok_v is not None else None,
            "feat_a": tok_a.mean(1) if tok_a is not None else None,
            "feat_v": tok_v.mean(1) if tok_v is not None else None,
        }

    # -- training ----------------------------------------------------------------------------------------------------
    def _drop_modalities(self, tok_a: torch.Tensor, tok_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero one modality's tokens for a random ``modality_dropout`` fraction of the samples."""
        if self.modality_dropout == 0:
            return tok_a, tok_v
        b = tok_a.shape[0]
        drop = torch.rand(b, device=tok_a.device) < self.modality_dropout
        which_audio = torch.rand(b, device=tok_a.device) < 0.5
        keep_a = ~(drop & which_audio)
        keep_v = ~(drop & ~which_audio)
        return tok_a * keep_a[:, None, None], tok_v * keep_v[:, None, None]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (a, v), y = batch
        tok_a, tok_v = self.net.encode_audio(a), self.net.encode_video(v)
        logits = self.net.fuse(*self._drop_modalities(tok_a, tok_v), "multimodal")
        loss = F.cross_entropy(logits, y)
        if self.unimodal_weight:
            uni = F.cross_entropy(self.net.fuse(tok_a, None, "audioonly"), y)
            uni = uni + F.cross_entropy(self.net.fuse(None, tok_v, "videoonly"), y)
            loss = loss + self.unimodal_weight * uni / 2
        self.train_metrics(logits.argmax(-1), y)
        self.log("train/loss", loss, prog_bar=True)
        self.log_dict(self.train_metrics, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        (a, v), y = batch
        tok_a, tok_v = self.net.encode_audio(a), self.net.encode_video(v)
        logits = self.net.fuse(tok_a, tok_v, "multimodal")
        self.val_metrics(logits.argmax(-1), y)
        self.log("val/loss", F.cross_entropy(logits, y), prog_bar=True, batch_size=len(y))
        self.log_dict(self.val_metrics, on_step=False, on_epoch=True, prog_bar=True, batch_size=len(y))
        for m, z in (
            ("audio", self.net.fuse(tok_a, None, "audioonly")),
            ("video", self.net.fuse(None, tok_v, "videoonly")),
        ):
            self.val_uni[m](z.argmax(-1), y)
            self.log(f"val/acc_{m}", self.val_uni[m], on_step=False, on_epoch=True, batch_size=len(y))

    def test_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        """Predict after the TTA callback (if any) adapted on this batch; returns the predictions for the callback."""
        x, y = batch
        logits = self(x)
        preds = logits.argmax(-1)
        self.test_metrics(preds, y)
        self.log("test/loss", F.cross_entropy(logits, y), batch_size=len(y))
        self.log_dict(self.test_metrics, on_step=False, on_epoch=True, batch_size=len(y))
        return {"preds": preds}
