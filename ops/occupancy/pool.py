"""Lift-splat voxel pooling in pure torch (replaces the ``bev_pool_v2`` CUDA kernel of the official code).

Each camera pixel carries a depth distribution ``p_d`` over D depth bins and a context vector ``c``; the frustum
point of bin d gets the feature ``p_d * c`` (the outer product of Lift-Splat-Shoot, Philion & Fidler 2020) and is
summed into the voxel it falls in. Points outside the grid are dropped.
"""

from __future__ import annotations

import torch


def voxel_index(points: torch.Tensor, pc_range: tuple[float, ...], grid: tuple[int, int, int]) -> torch.Tensor:
    """Flat voxel index ``(ix * Y + iy) * Z + iz`` of world points [..., 3], or -1 outside the grid."""
    lo = points.new_tensor(pc_range[:3])
    hi = points.new_tensor(pc_range[3:])
    size = (hi - lo) / points.new_tensor(grid)
    idx = torch.floor((points - lo) / size).long()
    g = torch.tensor(grid, device=points.device)
    inside = ((idx >= 0) & (idx < g)).all(-1)
    flat = (idx[..., 0] * grid[1] + idx[..., 1]) * grid[2] + idx[..., 2]
    return torch.where(inside, flat, torch.full_like(flat, -1))


def voxel_pool(
    depth: torch.Tensor,
    context: torch.Tensor,
    points: torch.Tensor,
    pc_range: tuple[float, ...],
    grid: tuple[int, int, int],
) -> torch.Tensor:
    """Splat frustum features into a voxel volume.

    Args:
        depth: [B, N, D, H, W] depth probabilities per camera pixel.
        context: [B, N, C, H, W] context features.
        points: [B, N, D, H, W, 3] frustum points in the ego (voxel) frame.
    Returns:
        [B, C, X, Y, Z] summed features.
    """
    b, c = depth.shape[0], context.shape[2]
    nvox = grid[0] * grid[1] * grid[2]
    feats = depth.unsqueeze(-1) * context.permute(0, 1, 3, 4, 2).unsqueeze(2)  # [B, N, D, H, W, C]
    flat = voxel_index(points, pc_range, grid)
    offset = torch.arange(b, device=depth.device).view(b, 1, 1, 1, 1) * nvox
    keep = flat >= 0
    index = (flat + offset)[keep]
    out = feats.new_zeros(b * nvox, c).index_add_(0, index, feats[keep])
    return out.view(b, grid[0], grid[1], grid[2], c).permute(0, 4, 1, 2, 3)
