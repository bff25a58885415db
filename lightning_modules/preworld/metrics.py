"""Occupancy metrics of PreWorld's evaluation: Occ3D IoU / mIoU (camera-mask aware), forecasting mIoU per horizon,
planning L2 and collision rate, accumulated with torchmetrics objects."""

from __future__ import annotations

import torch
import torchmetrics

IGNORE = 255


class OccupancyIoU(torchmetrics.Metric):
    """Confusion matrix over voxels (free = last class; voxels outside the camera mask ignored).

    ``compute()`` gives ``miou`` (mean IoU over the non-free classes seen in the labels or the predictions, as the
    Occ3D script averages its 17 semantic classes) and ``iou`` (occupied vs free)."""

    full_state_update = False

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.cm = torchmetrics.classification.MulticlassConfusionMatrix(num_classes, ignore_index=IGNORE)

    def update(self, pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        target = target if mask is None else torch.where(mask, target, torch.full_like(target, IGNORE))
        self.cm.update(pred.reshape(-1), target.reshape(-1))

    def compute(self) -> dict[str, torch.Tensor]:
        return iou_from_confusion(self.cm.compute().double())

    def reset(self) -> None:
        super().reset()
        self.cm.reset()


def iou_from_confusion(cm: torch.Tensor) -> dict[str, torch.Tensor]:
    """cm[target, pred] -> ``miou`` over non-free classes present in target or prediction, ``iou`` geometric."""
    tp = cm.diag()
    union = cm.sum(0) + cm.sum(1) - tp
    sem = slice(0, cm.shape[0] - 1)
    present = union[sem] > 0
    miou = (tp[sem][present] / union[sem][present]).mean() if present.any() else cm.new_zeros(())
    occ_tp = cm[sem, sem].sum()
    occ_union = cm.sum() - cm[-1, -1]
    return {"miou": miou, "iou": occ_tp / occ_union.clamp_min(1)}


def collisions(waypoints: torch.Tensor, obstacles: torch.Tensor, pc_range) -> torch.Tensor:
    """1 where waypoint k [B, K, 2] falls in an obstacle column of ``obstacles`` [B, K, X, Y], else 0 (off-grid: 0)."""
    b, k, nx, ny = obstacles.shape
    ix = torch.floor((waypoints[..., 0] - pc_range[0]) / (pc_range[3] - pc_range[0]) * nx).long()
    iy = torch.floor((waypoints[..., 1] - pc_range[1]) / (pc_range[4] - pc_range[1]) * ny).long()
    ok = (ix >= 0) & (ix < nx) & (iy >= 0) & (iy < ny)
    bi = torch.arange(b, device=waypoints.device)[:, None].expand(b, k)
    ki = torch.arange(k, device=waypoints.device)[None, :].expand(b, k)
    hit = obstacles[bi, ki, ix.clamp(0, nx - 1), iy.clamp(0, ny - 1)]
    return (hit & ok).float()
