"""Perception metrics of ADDP with invalid-pixel masking: depth AbsRel / delta1 / RMSE and mask IoU (torchmetrics).

Depth metrics are computed on valid pixels only (ground truth finite and > 0, the NYUv2 / KITTI convention):
AbsRel = mean |d^ - d| / d (torchmetrics ``MeanAbsolutePercentageError`` on the valid pixels), delta1 = share of
pixels with max(d^/d, d/d^) < 1.25, RMSE = sqrt(mean (d^ - d)^2) over all valid pixels of the split. Masks: overall
IoU (cumulative intersection / union, RefCOCO's oIoU: torchmetrics ``BinaryJaccardIndex``) and mean per-image IoU
(mIoU), where an image whose target and prediction are both empty scores 1 and an empty target with a non-empty
prediction scores 0.
"""

from __future__ import annotations

import torch
import torchmetrics
from torch import Tensor, nn


def mask_iou_per_image(pred: Tensor, target: Tensor) -> Tensor:
    """Per-image IoU of boolean masks [B, 1, H, W] -> [B]; both empty = 1."""
    p, t = pred.flatten(1).bool(), target.flatten(1).bool()
    inter, union = (p & t).sum(1).double(), (p | t).sum(1).double()
    return torch.where(union > 0, inter / union.clamp_min(1), torch.ones_like(union))


def depth_errors(pred: Tensor, target: Tensor, valid: Tensor) -> dict[str, Tensor]:
    """Sums over valid pixels for the per-step curve: {"absrel", "delta1", "sq", "n"} (float64 scalars)."""
    v = valid.bool() & torch.isfinite(target) & (target > 0)
    p, t = pred[v].double().clamp_min(1e-6), target[v].double()
    return {
        "absrel": ((p - t).abs() / t).sum(),
        "delta1": (torch.maximum(p / t, t / p) < 1.25).double().sum(),
        "sq": ((p - t) ** 2).sum(),
        "n": torch.tensor(float(v.sum()), dtype=torch.float64),
    }


class DepthMetrics(nn.Module):
    """torchmetrics AbsRel / delta1 / RMSE over the valid pixels of a split, keys ``<stage>/absrel`` etc."""

    def __init__(self, stage: str) -> None:
        super().__init__()
        self.stage = stage
        self.absrel = torchmetrics.MeanAbsolutePercentageError()
        self.rmse = torchmetrics.MeanSquaredError(squared=False)
        self.delta1 = torchmetrics.MeanMetric()

    def update(self, pred: Tensor, target: Tensor, valid: Tensor) -> None:
        v = valid.bool() & torch.isfinite(target) & (target > 0)
        if not bool(v.any()):
            return  # an image without any ground-truth pixel contributes nothing
        p, t = pred[v].float().clamp_min(1e-6), target[v].float()
        self.absrel.update(p, t)
        self.rmse.update(p, t)
        self.delta1.update((torch.maximum(p / t, t / p) < 1.25).float())

    def items(self) -> dict[str, torchmetrics.Metric]:
        return {
            f"{self.stage}/absrel": self.absrel,
            f"{self.stage}/rmse": self.rmse,
            f"{self.stage}/delta1": self.delta1,
        }


class MaskMetrics(nn.Module):
    """torchmetrics overall IoU (``<stage>/iou``) and mean per-image IoU (``<stage>/miou``)."""

    def __init__(self, stage: str) -> None:
        super().__init__()
        self.stage = stage
        self.iou = torchmetrics.classification.BinaryJaccardIndex(zero_division=1.0)
        self.miou = torchmetrics.MeanMetric()

    def update(self, pred: Tensor, target: Tensor) -> None:
        self.iou.update(pred.long().flatten(), target.long().flatten())
        self.miou.update(mask_iou_per_image(pred, target).float())

    def items(self) -> dict[str, torchmetrics.Metric]:
        return {f"{self.stage}/iou": self.iou, f"{self.stage}/miou": self.miou}
