"""A procedural driving world for PreWorld's embedded default (no network): voxel occupancy over time, rendered to
multi-view camera images, depth and semantics by the suite's own ray caster.

What it models, and why it tests the paper's claims:

* **Scene**: a straight road (driveable surface, ``|y| < 4`` m) flanked by grass (vegetation) on the ground layer,
  buildings and trees as static boxes beside the road, and cars as boxes moving at constant velocity in the two
  lanes and ahead of the ego (a lead car), so the future occupancy is predictable from the present (forecasting) and
  the ego's motion changes where everything appears in its own frame (ego conditioning).
* **Ego**: drives along +x with a per-scene constant acceleration and a sinusoidal lateral drift, so the next
  waypoints follow from the recent velocity history better than from the current velocity alone (the
  constant-velocity planner is a real baseline, not a perfect one). The ego frame is axis-aligned with the world
  (translation only; nuScenes ego poses also rotate).
* **Labels**: per frame, the semantic occupancy of the ego-centred grid (``num_classes - 1`` = empty, as Occ3D's
  17 = free) and Occ3D's camera-visibility mask (voxels a camera ray passes through or stops in).
* **2D labels**: each camera pixel is a ray; the caster marches it through the voxel grid and returns the first hit's
  distance, class and colour (a per-class colour with per-voxel shade and an exponential fog towards the sky colour,
  the monocular depth cue a small image encoder can learn). Rays that leave the grid without a hit are invalid for
  depth and semantics, as LiDAR points beyond the labelled range are in the paper's ray set.

Every number is a function of the seed only. Classes: 0 driveable surface, 1 building, 2 vegetation, 3 car (the
dynamic class), 4 empty.
"""

from __future__ import annotations

import math

import torch

CLASSES = ("driveable_surface", "building", "vegetation", "car", "empty")
DYNAMIC = (3,)
PALETTE = torch.tensor([[0.35, 0.35, 0.38], [0.75, 0.45, 0.30], [0.20, 0.60, 0.20], [0.15, 0.25, 0.85]])
SKY = torch.tensor([0.80, 0.85, 0.95])


def camera_rig(n_cams: int, height: int, width: int, cam_height: float = 1.5, pitch_deg: float = 12.0):
    """Pinhole cameras at the ego origin, ``cam_height`` up, yaws evenly spread (front first), 90 deg horizontal
    field of view, pitched down. Returns intrinsics [N, 3, 3] and camera-to-ego [N, 4, 4] (camera: x right,
    y down, z forward, as nuScenes)."""
    f = (width / 2) / math.tan(math.radians(45.0))
    k = torch.tensor([[f, 0.0, width / 2], [0.0, f, height / 2], [0.0, 0.0, 1.0]])
    base = torch.tensor([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])  # camera axes -> ego (front view)
    p = math.radians(pitch_deg)
    pitch = torch.tensor([[math.cos(p), 0.0, math.sin(p)], [0.0, 1.0, 0.0], [-math.sin(p), 0.0, math.cos(p)]])
    mats = []
    for i in range(n_cams):
        a = 2 * math.pi * i / n_cams
        yaw = torch.tensor([[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0], [0.0, 0.0, 1.0]])
        m = torch.eye(4)
        m[:3, :3] = yaw @ pitch @ base
        m[:3, 3] = torch.tensor([0.0, 0.0, cam_height])
        mats.append(m)
    return k.expand(n_cams, 3, 3).clone(), torch.stack(mats)


def pixel_rays(intrins: torch.Tensor, cam2ego: torch.Tensor, height: int, width: int):
    """Unit rays through pixel centres in the ego frame: origins, dirs [N * H * W, 3]."""
    v, u = torch.meshgrid(torch.arange(height) + 0.5, torch.arange(width) + 0.5, indexing="ij")
    pix = torch.stack([u, v, torch.ones_like(u)], -1).reshape(-1, 3)
    dirs = torch.einsum("nij,pj->npi", torch.linalg.inv(intrins), pix)
    dirs = torch.einsum("nij,npj->npi", cam2ego[:, :3, :3], dirs)
    dirs = dirs / dirs.norm(dim=-1, keepdim=True)
    origins = cam2ego[:, None, :3, 3].expand_as(dirs)
    return origins.reshape(-1, 3), dirs.reshape(-1, 3)


def voxel_centres(grid: tuple[int, int, int], pc_range: tuple[float, ...]) -> torch.Tensor:
    lo, hi = torch.tensor(pc_range[:3]), torch.tensor(pc_range[3:])
    size = (hi - lo) / torch.tensor(grid)
    axes = [lo[k] + size[k] * (torch.arange(grid[k]) + 0.5) for k in range(3)]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), -1)  # [X, Y, Z, 3]


def cast_rays(occ: torch.Tensor, origins, dirs, pc_range, max_depth: float, step: float = 0.05, empty: int = 4):
    """March rays through a semantic grid [X, Y, Z]: first-hit depth [R], class [R] (-1: no hit), hit voxel flat
    index [R] and the camera-visibility mask [X, Y, Z] (voxels passed through or hit)."""
    grid = occ.shape
    lo, hi = torch.tensor(pc_range[:3]), torch.tensor(pc_range[3:])
    size = (hi - lo) / torch.tensor(grid)
    t = torch.arange(step, max_depth, step)
    pts = origins[:, None] + t[None, :, None] * dirs[:, None]  # [R, T, 3]
    idx = torch.floor((pts - lo) / size).long()
    inside = ((idx >= 0) & (idx < torch.tensor(grid))).all(-1)
    flat = (idx[..., 0].clamp(0, grid[0] - 1) * grid[1] + idx[..., 1].clamp(0, grid[1] - 1)) * grid[2]
    flat = flat + idx[..., 2].clamp(0, grid[2] - 1)
    cls = torch.where(inside, occ.reshape(-1)[flat], torch.full_like(flat, empty))
    hit = cls != empty
    any_hit = hit.any(1)
    first = torch.where(any_hit, hit.float().argmax(1), torch.full_like(any_hit, t.numel() - 1, dtype=torch.long))
    rows = torch.arange(t.numel())[None, :]
    seen = inside & (rows <= first[:, None])
    visible = torch.zeros(occ.numel(), dtype=torch.bool)
    visible[flat[seen]] = True
    r = torch.arange(origins.shape[0])
    depth = torch.where(any_hit, t[first], torch.zeros_like(t[first]))
    return depth, torch.where(any_hit, cls[r, first], -torch.ones_like(first)), flat[r, first], visible.view(grid)


class DrivingWorld:
    """Seeded scenes of boxes; ``frame(scene, f)`` gives the ego-frame occupancy of frame f.

    Args:
        grid: Voxels (X, Y, Z) of the label grid.
        pc_range: (x0, y0, z0, x1, y1, z1) metres of the grid around the ego.
        seed: Seed of every scene.
    """

    def __init__(self, grid=(16, 16, 4), pc_range=(-8.0, -8.0, -1.0, 8.0, 8.0, 3.0), seed: int = 0) -> None:
        self.grid, self.pc_range, self.seed = tuple(grid), tuple(pc_range), seed
        self.centres = voxel_centres(self.grid, self.pc_range)

    def scene(self, index: int, n_frames: int) -> dict:
        g = torch.Generator().manual_seed(self.seed * 100003 + index)

        def u(a, b, n=()):
            return a + (b - a) * torch.rand(n, generator=g)

        f = torch.arange(-8, n_frames + 1, dtype=torch.float32)
        v0, acc = u(0.5, 1.3), u(-0.05, 0.05)
        amp, period, phase = u(0.0, 1.2), u(8.0, 16.0), u(0.0, 2 * math.pi)
        x = v0 * f + 0.5 * acc * f * f.abs()
        y = amp * torch.sin(2 * math.pi * f / period + phase)
        ego = torch.stack([x, y], -1)  # positions of frames -8..n_frames
        span = (float(x.min()) - 12, float(x.max()) + 12)
        boxes = []  # (x0, y0, z0, x1, y1, z1, vx, cls)
        xs = span[0]
        while xs < span[1]:
            for side in (-1, 1):
                if torch.rand((), generator=g) < 0.7:
                    d0, ln, hgt = u(5.0, 6.5), u(2.0, 5.0), u(1.5, 3.0)
                    y0, y1 = sorted((side * d0, side * (d0 + u(1.5, 3.0))))
                    boxes.append((xs, float(y0), 0.0, xs + float(ln), float(y1), float(hgt), 0.0, 1))
                else:
                    ty = side * u(4.2, 5.5)
                    boxes.append((xs, float(ty) - 0.5, 0.0, xs + 1.0, float(ty) + 0.5, float(u(1.0, 2.2)), 0.0, 2))
            xs += float(u(3.0, 6.0))
        lead = float(u(4.0, 7.0))
        boxes.append((lead, -0.6, 0.0, lead + 2.5, 0.6, 1.2, float(v0 + u(-0.3, 0.3)), 3))
        for _ in range(int(torch.randint(3, 7, (), generator=g))):
            lane = 2.5 if torch.rand((), generator=g) < 0.5 else -2.5
            cx = float(u(span[0], span[1]))
            vx = float(u(0.3, 1.8)) * (1 if lane < 0 else -1)
            boxes.append((cx, lane - 0.6, 0.0, cx + 2.5, lane + 0.6, 1.2, vx, 3))
        return {"ego": ego, "first": -8, "boxes": torch.tensor(boxes)}

    def occupancy(self, scene: dict, f: int, origin_frame: int | None = None) -> torch.Tensor:
        """Semantic grid [X, Y, Z] of frame f, centred on the ego of ``origin_frame`` (default f)."""
        origin = scene["ego"][(f if origin_frame is None else origin_frame) - scene["first"]]
        p = self.centres.clone()
        p[..., 0] += origin[0]
        p[..., 1] += origin[1]
        ground = torch.where(p[..., 1].abs() < 4.0, 0, 2)
        occ = torch.where(p[..., 2] < 0.0, ground, torch.full_like(ground, len(CLASSES) - 1))
        b = scene["boxes"]
        x0 = b[:, 0] + b[:, 6] * f
        x1 = b[:, 3] + b[:, 6] * f
        for prio in (2, 1, 3):  # later classes paint over earlier ones: cars over buildings over trees
            sel = b[:, 7] == prio
            if not sel.any():
                continue
            inside = (
                (p[..., None, 0] >= x0[sel]) & (p[..., None, 0] < x1[sel])
                & (p[..., None, 1] >= b[sel, 1]) & (p[..., None, 1] < b[sel, 4])
                & (p[..., None, 2] >= b[sel, 2]) & (p[..., None, 2] < b[sel, 5])
            ).any(-1)  # fmt: skip
            occ = torch.where(inside, torch.full_like(occ, prio), occ)
        return occ

    def ego_state(self, scene: dict, f: int, history: int = 7) -> torch.Tensor:
        """(vx, vy, yaw rate) at frames f, f-1, ..., f-history+1, flattened [3 * history] (yaw rate is 0 here)."""
        e = scene["ego"]
        i = f - scene["first"]
        vel = [torch.cat([e[i - h] - e[i - h - 1], torch.zeros(1)]) for h in range(history)]
        return torch.cat(vel)

    def waypoints(self, scene: dict, f: int, horizon: int) -> torch.Tensor:
        """Future ego positions of frames f+1..f+K in the ego frame of f: [K, 2]."""
        e = scene["ego"]
        i = f - scene["first"]
        return e[i + 1 : i + 1 + horizon] - e[i]
