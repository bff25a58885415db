"""PreWorld's network (Li et al., ICLR 2025): multi-camera images -> voxel volume -> attributes / occupancy, and the
state-conditioned forecasting module.

* :class:`ImageEncoder`: a small CNN (default) or a timm backbone giving, per camera pixel of stride ``stride``, a
  depth distribution over ``depth_bins`` and a context vector (Lift-Splat-Shoot's "lift").
* :class:`LiftSplat`: frustum points through each camera's intrinsics and camera-to-ego pose, splatted into the
  voxel grid by :func:`ops.occupancy.pool.voxel_pool`, then a 3D conv (``final_conv``) to V [B, C, X, Y, Z].
* :class:`AttributeHeads`: per-voxel MLPs of Sec. 3.2 (density 2 Softplus layers, semantics, colour).
* :class:`OccHead`: the 3D conv occupancy head of the fully supervised stage.
* :class:`Forecaster`: one step of Sec. 3.3 (official ``PreWorld4DTraj``): e = MLP_plan(s); V' = V + MLP_fuse([V, e]);
  g = AvgPool(Conv3d^3(V')); e' = e + MLP_ego([e, g]); waypoint = MLP_traj(e').
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ops.occupancy.pool import voxel_pool


def mlp(dims: list[int], act=nn.Softplus, last_act: bool = False) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(dims) - 1):
        layers.append(nn.Linear(dims[i], dims[i + 1]))
        if i < len(dims) - 2 or last_act:
            layers.append(act())
    return nn.Sequential(*layers)


class ImageEncoder(nn.Module):
    """Per-camera features at stride ``stride`` -> depth logits [.., D, h, w] and context [.., C, h, w].

    Args:
        backbone: ``cnn`` (3 conv blocks) or ``timm:<model name>`` (features_only, no pretrained weights are
            downloaded: set ``pretrained`` only with local weights in the timm cache); ``timm_index`` picks the
            feature level (2: stride 8 for ResNets).
    """

    def __init__(
        self,
        depth_bins: int,
        context: int,
        width: int = 32,
        stride: int = 2,
        backbone: str = "cnn",
        pretrained: bool = False,
        timm_index: int = 2,
    ) -> None:
        super().__init__()
        self.depth_bins, self.context, self.stride = depth_bins, context, stride
        if backbone == "cnn":
            convs = [nn.Conv2d(3, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
            s = 1
            while s < stride:
                convs += [nn.Conv2d(width, width, 3, stride=2, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
                s *= 2
            convs += [nn.Conv2d(width, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
            self.body, out = nn.Sequential(*convs), width
        elif backbone.startswith("timm:"):
            import timm

            self.body = timm.create_model(
                backbone[5:], pretrained=pretrained, features_only=True, out_indices=(timm_index,)
            )
            out = self.body.feature_info.channels()[0]
            self.stride = self.body.feature_info.reduction()[0]
        else:
            raise ValueError(f"model.backbone={backbone!r} must be 'cnn' or 'timm:<name>'")
        self.timm = backbone != "cnn"
        self.head = nn.Conv2d(out, depth_bins + context, 1)

    def forward(self, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.body(img)
        x = self.head(x[0] if self.timm else x)
        return x[:, : self.depth_bins], x[:, self.depth_bins :]


class LiftSplat(nn.Module):
    """Images [B, N, 3, H, W] + intrinsics [B, N, 3, 3] + camera-to-ego [B, N, 4, 4] -> V [B, C, X, Y, Z]."""

    def __init__(
        self,
        grid,
        pc_range,
        depth_range=(1.0, 12.0),
        depth_bins: int = 16,
        context: int = 16,
        channels: int = 32,
        width: int = 32,
        stride: int = 2,
        backbone: str = "cnn",
        timm_index: int = 2,
    ) -> None:
        super().__init__()
        self.grid, self.pc_range = tuple(grid), tuple(pc_range)
        self.encoder = ImageEncoder(depth_bins, context, width, stride, backbone, timm_index=timm_index)
        self.register_buffer("depths", torch.linspace(depth_range[0], depth_range[1], depth_bins), persistent=False)
        self.final_conv = nn.Sequential(
            nn.Conv3d(context, channels, 3, padding=1),
            nn.BatchNorm3d(channels),
            nn.ReLU(),
            nn.Conv3d(channels, channels, 3, padding=1),
        )

    def frustum(self, intrins, cam2ego, h: int, w: int, stride: int) -> torch.Tensor:
        """Ego-frame points of every (depth bin, feature pixel): [B, N, D, h, w, 3]."""
        dev, dt = intrins.device, intrins.dtype
        rows = (torch.arange(h, device=dev, dtype=dt) + 0.5) * stride
        cols = (torch.arange(w, device=dev, dtype=dt) + 0.5) * stride
        v, u = torch.meshgrid(rows, cols, indexing="ij")
        pix = torch.stack([u, v, torch.ones_like(u)], -1)  # [h, w, 3]
        rays = torch.einsum("bnij,hwj->bnhwi", torch.linalg.inv(intrins), pix)
        pts = rays[:, :, None] * self.depths.to(dt).view(1, 1, -1, 1, 1, 1)  # [B, N, D, h, w, 3]
        return torch.einsum("bnij,bndhwj->bndhwi", cam2ego[..., :3, :3], pts) + cam2ego[:, :, None, None, None, :3, 3]

    def forward(self, img, intrins, cam2ego) -> torch.Tensor:
        b, n = img.shape[:2]
        depth, ctx = self.encoder(img.flatten(0, 1))
        h, w = depth.shape[-2:]
        stride = img.shape[-1] / w
        depth = depth.softmax(1).view(b, n, -1, h, w)
        ctx = ctx.view(b, n, -1, h, w)
        pts = self.frustum(intrins, cam2ego, h, w, stride)
        vol = voxel_pool(depth, ctx, pts, self.pc_range, self.grid)
        return self.final_conv(vol)


class AttributeHeads(nn.Module):
    """Per-voxel density (C -> 2C -> 2, Softplus both; channel 0), semantic logits (C -> 2C -> S) and colour
    (C -> 2C -> 3, sigmoid) projections of Sec. 3.2. V [B, C, X, Y, Z] -> [B, 1 + S + 3, X, Y, Z]."""

    def __init__(self, channels: int, n_sem: int) -> None:
        super().__init__()
        h = 2 * channels
        self.density = mlp([channels, h, 2], last_act=True)
        self.semantic = mlp([channels, h, n_sem])
        self.color = mlp([channels, h, 3])

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        x = v.permute(0, 2, 3, 4, 1)
        out = torch.cat([self.density(x)[..., :1], self.semantic(x), torch.sigmoid(self.color(x))], -1)
        return out.permute(0, 4, 1, 2, 3)


class OccHead(nn.Module):
    """3D conv occupancy head: V -> logits [B, num_classes, X, Y, Z] (the last class is free)."""

    def __init__(self, channels: int, num_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv3d(channels, channels, 3, padding=1), nn.Softplus(), nn.Conv3d(channels, num_classes, 1)
        )

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return self.net(v)


class Forecaster(nn.Module):
    """State-conditioned forecasting step (Sec. 3.3; dims of the official code scaled by ``channels``/32).

    ``forward(v, e)`` with V [B, C, X, Y, Z] and the ego embedding e [B, C] returns (V', e', waypoint [B, 2]).
    ``embed(ego_state)`` is MLP_plan (state_dim -> 8C -> 8C -> C).

    Differences from the official ``PreWorld4DTraj`` (docs/methods/preworld.md): the downscale block uses kernel 3,
    padding 1 and ReLUs where ``DownScaleModule3DCustom`` uses kernel 2, no padding, no activation (three unpadded
    halvings of the embedded grid's 4 z-voxels would reach 0); MLP_ego and MLP_traj use ReLU where the official
    ``ego_fusion_head`` and ``traj_head`` use Softplus (MLP_plan ReLU and MLP_fuse Softplus match).
    """

    def __init__(self, channels: int, state_dim: int = 21) -> None:
        super().__init__()
        c = channels
        self.plan = mlp([state_dim, 8 * c, 8 * c, c], act=nn.ReLU)
        self.fuse = mlp([2 * c, 4 * c, c])
        self.down = nn.Sequential(
            nn.Conv3d(c, 2 * c, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv3d(2 * c, 4 * c, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv3d(4 * c, 4 * c, 3, stride=2, padding=1),
            nn.ReLU(),
        )
        self.ego = mlp([5 * c, 8 * c, 4 * c, 2 * c, c], act=nn.ReLU)
        self.traj = mlp([c, 2 * c, 2], act=nn.ReLU)

    def embed(self, ego_state: torch.Tensor) -> torch.Tensor:
        return self.plan(ego_state)

    def forward(self, v: torch.Tensor, e: torch.Tensor):
        b, c = v.shape[:2]
        eb = e[:, :, None, None, None].expand_as(v)
        x = torch.cat([v, eb], 1).permute(0, 2, 3, 4, 1)
        v2 = v + self.fuse(x).permute(0, 4, 1, 2, 3)
        g = F.adaptive_avg_pool3d(self.down(v2), 1).flatten(1)
        e2 = e + self.ego(torch.cat([e, g], 1))
        return v2, e2, self.traj(e2)


def forecast(v, ego_state, module: Forecaster, steps: int, roll_state: bool = True, ego_conditioning: bool = True):
    """Recursive forecasting: ``[V_1..V_K]`` and per-step offsets [B, K, 2].

    ``roll_state=True`` (the paper's recursion) feeds e'_k to step k+1; ``False`` is the official code, which
    re-embeds the current state ``temporal_ego_states[0]`` at every step. ``ego_conditioning=False`` (baseline)
    zeroes the ego state."""
    state = ego_state if ego_conditioning else torch.zeros_like(ego_state)
    e = module.embed(state)
    vols, offsets = [], []
    for _ in range(steps):
        v, e_next, wp = module(v, e)
        vols.append(v)
        offsets.append(wp)
        e = e_next if roll_state else module.embed(state)
    return vols, (torch.stack(offsets, 1) if offsets else v.new_zeros(v.shape[0], 0, 2))
