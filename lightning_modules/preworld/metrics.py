"""Occupancy metrics of PreWorld's evaluation: Occ3D IoU / mIoU (camera-masked, or unmasked as the official 4D
evaluation), forecasting mIoU per horizon, the ST-P3 planning metric (L2 and ego-box collisions averaged over the
steps up to each horizon; the waypoint-in-obstacle point form kept beside it), and the occupancy warp by known ego
poses that the standard copy-last baseline needs. Accumulated with torchmetrics objects in the module."""

from __future__ import annotations

import math

import torch
import torchmetrics

from core.errors import ConfigError

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


# -- ST-P3 planning metric (as PreWorld's and OccWorld's evaluations load it) ---------------------------------------
EGO_LENGTH, EGO_WIDTH, EGO_OFFSET = 4.084, 1.85, 0.5  # ST-P3's ego box, centred 0.5 m ahead of the ego origin
COLLISION_RULES = ("cells", "official")


def horizon_average(per_step: torch.Tensor) -> torch.Tensor:
    """ST-P3's horizon convention: the value at horizon k is the mean over steps 1..k. per_step [..., K] ->
    [..., K] (the nuScenes table's 1 s / 2 s / 3 s are the means up to steps 2 / 4 / 6 at 2 Hz)."""
    steps = torch.arange(1, per_step.shape[-1] + 1, device=per_step.device, dtype=per_step.dtype)
    return per_step.cumsum(-1) / steps


def ego_box_collisions(
    waypoints: torch.Tensor,
    agents: torch.Tensor,
    extent: torch.Tensor,
    length: float = EGO_LENGTH,
    width: float = EGO_WIDTH,
    offset: float = EGO_OFFSET,
    rule: str = "cells",
) -> torch.Tensor:
    """ST-P3's box collision: 1 where the ego box at waypoint k covers a cell of the other agents' BEV map at step k.

    The box (``length`` x ``width``, centred ``offset`` ahead of the waypoint) stays aligned with the current ego
    frame, as ST-P3 rasterises it (no heading). ``rule`` says which cells it covers:

    * ``cells``: the cells whose centres it contains (any raster resolution).
    * ``official``: OccWorld's ``PlanningMetric.evaluate_single_coll`` (``utils/metric_stp3.py``, the code PreWorld
      evaluates with), stated for a raster of this layout: the box is sampled at the points ``(i + 1/2) * cell``
      of the ego frame that fall inside it (8 x 4 points at 0.5 m cells), the waypoint moves those points, and each
      point reads the cell that contains it along x but the cell one further to the left (+y) across: the official
      code indexes the raster's columns half a cell off its own rasteriser, so its box reads 0.5 m left of where it
      sits at 0.5 m cells. Points beyond the raster read its edge cells (the official code clips the indices).
      On a 0.5 m raster the ``cells`` box covers 8 or 9 cells along x (vs 8) and 3 or 4 across (vs 4) and sits
      one cell to the right of the official one.

    Args:
        waypoints: [B, K, 2] ego positions in the current ego frame (m).
        agents: [B, K, H, W] bool, other agents' boxes at step k on a BEV raster of the current ego frame.
        extent: [B, 4] or [4], (x0, y0, x1, y1) metres the raster covers.

    Returns:
        [B, K] float, 1 = collision.
    """
    if rule not in COLLISION_RULES:
        raise ConfigError(f"collision rule {rule!r} must be one of {list(COLLISION_RULES)}")
    b, k, h, w = agents.shape
    ext = extent.to(waypoints.dtype).reshape(-1, 4).expand(b, 4)
    if rule == "official":
        return _official_box_collisions(waypoints, agents, ext, length, width, offset)
    xs = ext[:, None, 0] + (ext[:, None, 2] - ext[:, None, 0]) * (torch.arange(h, device=agents.device) + 0.5) / h
    ys = ext[:, None, 1] + (ext[:, None, 3] - ext[:, None, 1]) * (torch.arange(w, device=agents.device) + 0.5) / w
    dx = (xs[:, None, :, None] - waypoints[..., 0, None, None] - offset).abs() <= length / 2  # [B, K, H, 1]
    dy = (ys[:, None, None, :] - waypoints[..., 1, None, None]).abs() <= width / 2  # [B, K, 1, W]
    return (dx & dy & agents).flatten(2).any(-1).float()


def _lattice(lo: float, hi: float, cell: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The points ``(i + 1/2) * cell`` (integer ``i``) in ``[lo, hi]``."""
    first, last = math.ceil(lo / cell - 0.5), math.floor(hi / cell - 0.5)
    return (torch.arange(first, last + 1, device=device, dtype=dtype) + 0.5) * cell


def _official_box_collisions(
    waypoints: torch.Tensor, agents: torch.Tensor, ext: torch.Tensor, length: float, width: float, offset: float
) -> torch.Tensor:
    """``ego_box_collisions(rule="official")`` (its docstring): [B, K] float."""
    b, k, h, w = agents.shape
    cx, cy = (ext[:, 2] - ext[:, 0]) / h, (ext[:, 3] - ext[:, 1]) / w  # [B] cell sizes
    out = waypoints.new_zeros(b, k)
    for i in range(b):
        fx = _lattice(offset - length / 2, offset + length / 2, float(cx[i]), waypoints.dtype, waypoints.device)
        fy = _lattice(-width / 2, width / 2, float(cy[i]), waypoints.dtype, waypoints.device)
        px = waypoints[i, :, 0, None] + fx  # [K, nx]
        py = waypoints[i, :, 1, None] + fy  # [K, ny]
        hi = torch.floor((px - ext[i, 0]) / cx[i]).long().clamp(0, h - 1)
        wi = (torch.floor((py - ext[i, 1]) / cy[i]).long() + 1).clamp(0, w - 1)
        steps = torch.arange(k, device=agents.device)[:, None, None]
        out[i] = agents[i][steps, hi[:, :, None], wi[:, None, :]].flatten(1).any(-1).to(out.dtype)
    return out


def stp3_collisions(
    plan: torch.Tensor, gt: torch.Tensor, agents: torch.Tensor, extent: torch.Tensor, **box
) -> torch.Tensor:
    """ST-P3's ``evaluate_coll``: box collisions of the plan [B, K], not counted at steps where the ground-truth
    trajectory's own box collides (those steps count as no collision; the denominator keeps every sample).
    ``box``: :func:`ego_box_collisions`'s box and ``rule``."""
    gt_col = ego_box_collisions(gt, agents, extent, **box) > 0
    return ego_box_collisions(plan, agents, extent, **box) * (~gt_col).float()


def warp_occupancy(occ: torch.Tensor, pose: torch.Tensor, pc_range, fill: int) -> torch.Tensor:
    """The occupancy of a source frame [B, X, Y, Z] resampled into a target ego frame (nearest voxel): each target
    voxel centre p goes to ``pose @ p`` in the source frame (pose [B, 4, 4]: the target ego in the source ego frame);
    centres that land outside the source grid get ``fill`` (free). Exact for motions that map voxel centres onto
    voxel centres (whole-voxel shifts, quarter turns)."""
    b, nx, ny, nz = occ.shape
    lo = torch.tensor(pc_range[:3], dtype=pose.dtype, device=occ.device)
    hi = torch.tensor(pc_range[3:], dtype=pose.dtype, device=occ.device)
    n = torch.tensor([nx, ny, nz], device=occ.device)
    size = (hi - lo) / n
    axes = [lo[i] + size[i] * (torch.arange(int(n[i]), device=occ.device, dtype=pose.dtype) + 0.5) for i in range(3)]
    centres = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)  # [P, 3]
    src = torch.einsum("bij,pj->bpi", pose[:, :3, :3], centres) + pose[:, None, :3, 3]
    idx = torch.floor((src - lo) / size + 1e-6).long()
    ok = ((idx >= 0) & (idx < n)).all(-1)
    idx = torch.minimum(idx.clamp_min(0), n - 1)
    flat = (idx[..., 0] * ny + idx[..., 1]) * nz + idx[..., 2]
    out = torch.gather(occ.reshape(b, -1), 1, flat)
    return torch.where(ok, out, torch.full_like(out, fill)).view(b, nx, ny, nz)
