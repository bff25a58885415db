"""Perception metrics of ADDP with invalid-pixel masking: depth AbsRel / delta1 / RMSE and mask IoU (torchmetrics).

Depth is metric throughout: the model works in [-1, 1] through the *fixed* range ``depth_min..depth_max`` of the
module (the same for every image; no per-image min/max normalisation), its prediction is decoded back to metres, and
the metrics compare those metres with the metric ground truth, with no scale or shift alignment. Two protocols
(``DepthMetrics(protocol=...)``, the module's ``depth_protocol``):

* ``pooled`` (the suite's, used on the embedded scenes): every valid pixel (ground truth finite and > 0) of the whole
  split pooled, no crop, no depth cap: AbsRel = mean |d^ - d| / d (torchmetrics ``MeanAbsolutePercentageError``),
  delta1 = share of pixels with max(d^/d, d/d^) < 1.25, RMSE = sqrt(mean (d^ - d)^2) over all valid pixels.
* ``nyu_eigen`` (the standard NYUv2 protocol, the one of the depth papers' NYUv2 tables: Eigen et al. 2014 as the
  BTS / AdaBins / Marigold evaluation scripts run it): the prediction clipped to [1e-3, 10] m, valid pixels the
  ground truth in (1e-3, 10) m inside the Eigen crop (rows 45:471, cols 41:601 of the 480 x 640 frame; at another
  resolution the same fractions of the frame, :func:`eigen_crop_mask`), AbsRel, RMSE and delta1 computed per image
  and averaged over images (an image with no valid pixel contributes nothing).

Masks: overall IoU (cumulative intersection / union, RefCOCO's oIoU: torchmetrics ``BinaryJaccardIndex``) and mean
per-image IoU (mIoU), where an image whose target and prediction are both empty scores 1 and an empty target with a
non-empty prediction scores 0.
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


DEPTH_PROTOCOLS = ("pooled", "nyu_eigen")
NYU_FRAME = (480, 640)  # NYUv2's image size (rows, cols)
EIGEN_CROP = (45, 471, 41, 601)  # rows 45:471, cols 41:601 of the 480 x 640 frame (Eigen et al. 2014)
NYU_MIN_DEPTH, NYU_MAX_DEPTH = 1e-3, 10.0  # metres: the protocol's valid range and prediction clip (10 m cap)


def eigen_crop_mask(h: int, w: int, device: torch.device | str | None = None) -> Tensor:
    """bool [h, w]: the Eigen crop of NYUv2 at resolution h x w (exactly rows 45:471, cols 41:601 at 480 x 640; at
    another resolution the same fractions of the frame, bounds rounded half up)."""
    r0, r1, c0, c1 = EIGEN_CROP
    fh, fw = h / NYU_FRAME[0], w / NYU_FRAME[1]
    m = torch.zeros(h, w, dtype=torch.bool, device=device)
    m[int(r0 * fh + 0.5) : int(r1 * fh + 0.5), int(c0 * fw + 0.5) : int(c1 * fw + 0.5)] = True
    return m


def nyu_eigen_errors(pred: Tensor, target: Tensor, valid: Tensor) -> dict[str, Tensor]:
    """The NYUv2 Eigen protocol per image: pred, target, valid [B, 1, H, W] -> {"absrel", "rmse", "delta1"} [B']
    (float64) over the B' images with at least one valid pixel (module docstring)."""
    t = torch.nan_to_num(target.double(), nan=0.0, posinf=0.0, neginf=0.0)
    p = torch.nan_to_num(pred.double(), nan=NYU_MAX_DEPTH, posinf=NYU_MAX_DEPTH, neginf=NYU_MIN_DEPTH)
    p = p.clamp(NYU_MIN_DEPTH, NYU_MAX_DEPTH)
    crop = eigen_crop_mask(*target.shape[-2:], device=target.device)
    v = valid.bool() & torch.isfinite(target) & (t > NYU_MIN_DEPTH) & (t < NYU_MAX_DEPTH) & crop
    t = torch.where(v, t, torch.ones_like(t))  # invalid pixels: any positive value, masked out below
    v, p, t = v.flatten(1), p.flatten(1), t.flatten(1)
    n = v.sum(1)
    keep = n > 0
    n = n.clamp_min(1).double()
    absrel = (((p - t).abs() / t) * v).sum(1) / n
    rmse = ((((p - t) ** 2) * v).sum(1) / n).sqrt()
    delta1 = ((torch.maximum(p / t, t / p) < 1.25) & v).sum(1) / n
    return {"absrel": absrel[keep], "rmse": rmse[keep], "delta1": delta1[keep]}


class DepthMetrics(nn.Module):
    """torchmetrics AbsRel / delta1 / RMSE of a split, keys ``<stage>/absrel`` etc., by ``protocol`` ``pooled``
    (every valid pixel of the split) or ``nyu_eigen`` (per image, Eigen crop, 10 m cap; module docstring)."""

    def __init__(self, stage: str, protocol: str = "pooled") -> None:
        super().__init__()
        if protocol not in DEPTH_PROTOCOLS:
            raise ValueError(f"depth protocol {protocol!r} must be one of {list(DEPTH_PROTOCOLS)}")
        self.stage, self.protocol = stage, protocol
        if protocol == "pooled":
            self.absrel = torchmetrics.MeanAbsolutePercentageError()
            self.rmse = torchmetrics.MeanSquaredError(squared=False)
        else:  # per-image values averaged over images
            self.absrel, self.rmse = torchmetrics.MeanMetric(), torchmetrics.MeanMetric()
        self.delta1 = torchmetrics.MeanMetric()

    def update(self, pred: Tensor, target: Tensor, valid: Tensor) -> None:
        if self.protocol == "nyu_eigen":
            e = nyu_eigen_errors(pred, target, valid)
            if len(e["absrel"]):
                for key in ("absrel", "rmse", "delta1"):
                    getattr(self, key).update(e[key].float())
            return
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
