"""Test-time adaptation fixtures: a tiny classifier with one norm layer, its random data, a tiny SuMi module (the
audio-visual transformer) and the bare CPU trainer the TTA tests run ``trainer.test`` with."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from layers.multimodal import AudioVisualTransformer
from lightning_modules.sumi import SumiLitModule

C = 4


class TinyClassifier(pl.LightningModule):
    """Linear -> norm -> linear; records the first norm weight seen by each test_step (adapt-then-predict)."""

    def __init__(self, norm: str = "layer") -> None:
        super().__init__()
        torch.manual_seed(0)
        norm_layer = {"layer": nn.LayerNorm(8), "batch": nn.BatchNorm1d(8), "none": nn.Identity()}[norm]
        self.net = nn.Sequential(nn.Linear(6, 8), norm_layer, nn.ReLU(), nn.Linear(8, C))
        self.num_classes = C
        self.seen: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def test_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        x, y = batch
        if hasattr(self.net[1], "weight"):
            self.seen.append(self.net[1].weight.detach().clone())
        return {"preds": self(x).argmax(-1)}


def loader(n: int = 32, batch: int = 8, seed: int = 0) -> DataLoader:
    """``n`` random examples ``(x [6], y)`` of :data:`C` classes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = torch.randint(0, C, (n,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch)


def tiny_sumi(num_classes: int = C, **kwargs: Any) -> SumiLitModule:
    """A seeded SuMi module on an 8x4 spectrogram and a 1x8x8 image, width 8, one modality-specific layer."""
    torch.manual_seed(0)
    net = AudioVisualTransformer(
        num_classes,
        audio_shape=(8, 4),
        audio_patch=(4, 2),
        image_shape=(1, 8, 8),
        image_patch=4,
        dim=8,
        heads=2,
        depth_specific=1,
    )
    return SumiLitModule(net, num_classes=num_classes, **kwargs)


def cpu_trainer(tmp_path: Any, callbacks: list[pl.Callback]) -> pl.Trainer:
    """A CPU trainer with no logger, checkpoints, bar or summary, writing into ``tmp_path``."""
    return pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=callbacks,
    )
