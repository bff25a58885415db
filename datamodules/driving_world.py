"""A procedural driving world for PreWorld's embedded default (no network): voxel occupancy over time, rendered to
multi-view camera images, depth and semantics by the suite's own ray caster.

What it models, and why it tests the paper's claims:

* **Road**: a two-lane road of constant curvature per scene (radius >= 25 m either way, or nearly straight), lanes
  3.5 m wide (driveable surface, ``|d| < 3.5`` m from the centre line) with grass (vegetation) beside it, cars
  parked on both shoulders, trees and buildings further out. Everything is placed in road coordinates (arc length
  s, lateral offset d), so the scenery bends with the road.
* **Other agents**: cars of 4.0 x 1.8 m (nuScenes-sized) in both lanes at their own speeds, some changing lanes, a
  lead car ahead of the ego, parked cars; the future occupancy is predictable from the present but not static.
* **Ego**: one of three behaviours per scene, each of which a constant-velocity planner gets wrong: (i) braking
  behind a lead car that brakes first, down to a queue stop a short gap behind it; (ii) a lane change (a cosine
  lateral profile of 4-7 frames, i.e. a heading change of up to ~40 deg); (iii) cruising with a mild acceleration.
  On top, the curved road turns the ego (yaw rate != 0). The ego frame rotates with the ego's heading, as nuScenes
  ego poses do, so the ego state carries (vx, vy, yaw rate) in the current ego frame. No agent's box overlaps the
  ego's true path (checked in road coordinates with a margin), so the ground-truth trajectory never collides.
* **Labels**: per frame, the semantic occupancy of the ego-centred grid (``num_classes - 1`` = empty, as Occ3D's
  17 = free) and Occ3D's camera-visibility mask (voxels a camera ray passes through or stops in); the agents' boxes
  as a finer BEV map (the ST-P3 collision target) and the ego poses of the future frames (for the warped copy-last).
* **2D labels**: each camera pixel is a ray; the caster marches it through the voxel grid and returns the first hit's
  distance, class and colour (a per-class colour with per-voxel shade and an exponential fog towards the sky colour,
  the monocular depth cue a small image encoder can learn). Rays that leave the grid without a hit are invalid for
  depth and semantics, as LiDAR points beyond the labelled range are in the paper's ray set.

A frame is a key frame of the world (nuScenes: 0.5 s); the ego drives 1-2 m per frame. Every number is a function of
the seed only. Classes: 0 driveable surface, 1 building, 2 vegetation, 3 car (the dynamic class), 4 empty.
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


LANE = 3.5  # lane width (m); two lanes, centres at d = -1.75 and +1.75
EGO_SIZE = (4.084, 1.85)  # ST-P3's ego box (length, width), centred 0.5 m ahead of the ego origin
CAR_SIZE = (4.0, 1.8, 1.6)  # other cars (length, width, height)
PARKED_D = LANE + 0.3 + CAR_SIZE[1] / 2  # centre offset of cars parked on the shoulder
MARGIN = 0.25  # clearance (m) every agent keeps from the ego's true box


def move(p: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Road coordinates of movers at frames f: p [M, 9] = (s0, v0, v1, t0, T, d0, d1, tl, Tl): the speed ramps
    linearly from v0 to v1 over frames [t0, t0 + T], the lateral offset goes from d0 to d1 on a cosine profile over
    [tl, tl + Tl]; s(0) = s0. Returns s, d, ds/df, dd/df, each [M, len(f)] (float64)."""
    p, f = p.double()[:, :, None], f.double()[None, :]
    s0, v0, v1, t0, tt, d0, d1, tl, tlen = p.unbind(1)

    def ramp_integral(x):  # integral of clip((u - t0) / T, 0, 1) from t0 to x
        u = (x - t0).clamp_min(0.0)
        return torch.where(u < tt, u * u / (2 * tt), tt / 2 + (u - tt))

    s = s0 + v0 * f + (v1 - v0) * (ramp_integral(f) - ramp_integral(torch.zeros_like(f)))
    ds = v0 + (v1 - v0) * ((f - t0) / tt).clamp(0.0, 1.0)
    c = ((f - tl) / tlen).clamp(0.0, 1.0)
    d = d0 + (d1 - d0) * (1 - torch.cos(math.pi * c)) / 2
    dd = torch.where((c > 0) & (c < 1), (d1 - d0) * math.pi / (2 * tlen) * torch.sin(math.pi * c), torch.zeros_like(c))
    return s, d, ds, dd


class DrivingWorld:
    """Seeded scenes on a curved two-lane road; ``occupancy(scene, f)`` gives the ego-frame occupancy of frame f.

    Args:
        grid: Voxels (X, Y, Z) of the label grid.
        pc_range: (x0, y0, z0, x1, y1, z1) metres of the grid around the ego.
        seed: Seed of every scene.
    """

    def __init__(self, grid=(16, 16, 4), pc_range=(-8.0, -8.0, -1.0, 8.0, 8.0, 3.0), seed: int = 0) -> None:
        self.grid, self.pc_range, self.seed = tuple(grid), tuple(pc_range), seed
        self.centres = voxel_centres(self.grid, self.pc_range)

    # -- scenes ---------------------------------------------------------------------------------------------
    def scene(self, index: int, n_frames: int) -> dict:
        """Scene ``index`` for frames -8..n_frames: road radius, ego and agent motions [M, 9] (see :func:`move`),
        static boxes [N, 6] (s0, s1, d0, d1, height, class) and the ego behaviour."""
        g = torch.Generator().manual_seed(self.seed * 100003 + index)

        def u(a, b):
            return float(a + (b - a) * torch.rand((), generator=g))

        kappa = u(-1 / 25, 1 / 25)
        radius = 1.0 / (kappa if abs(kappa) > 1e-4 else 1e-4)
        lane = -LANE / 2 if u(0, 1) < 0.6 else LANE / 2
        v0 = u(1.0, 1.8)
        kind = u(0, 1)
        movers = []
        if kind < 0.5:  # braking behind a lead car that brakes tau frames earlier, to a queue stop D behind it
            behaviour = "brake"
            v1, a = u(0.0, 0.2), u(0.25, 0.5)
            ego = [0.0, v0, v1, u(-1.0, 3.0), (v0 - v1) / a, lane, lane, 0.0, 1.0]
            tau, gap = u(0.3, 1.2), u(0.3, 1.2)
            s_tau = float(move(torch.tensor([ego]), torch.tensor([tau]))[0])
            gap0 = EGO_SIZE[0] / 2 + 0.5 + CAR_SIZE[0] / 2 + gap
            movers.append([s_tau + gap0, v0, v1, ego[3] - tau, ego[4], lane, lane, 0.0, 1.0])
        elif kind < 0.8:
            behaviour = "lane_change"
            ego = [0.0, v0, v0 + u(-0.2, 0.2), u(-4.0, 4.0), u(4.0, 10.0), lane, -lane, u(-2.0, 4.0), u(4.0, 7.0)]
        else:
            behaviour = "cruise"
            ego = [0.0, v0, v0 + u(-0.3, 0.3), u(-4.0, 4.0), u(4.0, 10.0), lane, lane, 0.0, 1.0]
        ego_t = torch.tensor([ego])
        frames = torch.arange(-8, n_frames + 1, dtype=torch.float64)
        s_e = move(ego_t, frames)[0][0]
        lo, hi = float(s_e.min()) - 20.0, float(s_e.max()) + 20.0
        for _ in range(int(torch.randint(3, 8, (), generator=g))):  # traffic in both lanes, some changing lanes
            d0 = -LANE / 2 if u(0, 1) < 0.5 else LANE / 2
            d1, tl, tlen = (-d0, u(-4.0, 6.0), u(4.0, 8.0)) if u(0, 1) < 0.3 else (d0, 0.0, 1.0)
            v = u(0.5, 2.2)
            movers.append([u(lo, hi), v, v, 0.0, 1.0, d0, d1, tl, tlen])
        for side in (-1, 1):  # parked cars on both shoulders
            s = lo + u(0.0, 4.0)
            while s < hi:
                if u(0, 1) < 0.5:
                    movers.append([s, 0.0, 0.0, 0.0, 1.0, side * PARKED_D, side * PARKED_D, 0.0, 1.0])
                s += u(5.0, 9.0)
        keep = self._clear(ego_t, torch.tensor(movers), frames)
        statics = []
        s = lo
        while s < hi:
            for side in (-1, 1):
                if u(0, 1) < 0.6:
                    d0 = u(7.0, 7.5)
                    statics.append((s, s + u(3.0, 6.0), side * d0, side * (d0 + u(2.0, 4.0)), u(2.0, 3.5), 1))
                else:
                    d0 = u(5.9, 6.4)
                    statics.append((s, s + 1.0, side * d0, side * (d0 + 1.0), u(1.5, 3.0), 2))
            s += u(3.0, 6.0)
        statics = torch.tensor(statics, dtype=torch.float64)
        statics[:, 2:4] = statics[:, 2:4].sort(1).values
        return {"radius": radius, "ego": ego_t, "agents": keep, "statics": statics, "first": -8, "behaviour": behaviour}

    @staticmethod
    def _clear(ego: torch.Tensor, movers: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
        """Movers whose box keeps ``MARGIN`` from the ego's true box and from every mover kept before it."""
        s_e, d_e = move(ego, frames)[:2]
        s_m, d_m = move(movers, frames)[:2]
        ds, dd = (EGO_SIZE[0] + CAR_SIZE[0]) / 2 + MARGIN, (EGO_SIZE[1] + CAR_SIZE[1]) / 2 + MARGIN
        ok = ~(((s_m - s_e - 0.5).abs() < ds) & ((d_m - d_e).abs() < dd)).any(1)
        keep: list[int] = []
        for i in range(len(movers)):
            if not ok[i]:
                continue
            near = ((s_m[i] - s_m[keep]).abs() < CAR_SIZE[0] + MARGIN) & ((d_m[i] - d_m[keep]).abs() < CAR_SIZE[1])
            if not near.any():
                keep.append(i)
        return movers[keep]

    # -- geometry ---------------------------------------------------------------------------------------------
    @staticmethod
    def to_world(radius: float, s: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Road (s along the centre line, d to its left) -> world (x, y); the road starts at the origin along +x
        and turns left for radius > 0."""
        phi = s / radius
        return (radius - d) * torch.sin(phi), radius - (radius - d) * torch.cos(phi)

    @staticmethod
    def to_road(radius: float, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """World (x, y) -> road (s, d), the inverse of :meth:`to_world`."""
        sign = 1.0 if radius > 0 else -1.0
        qx, qy = x, y - radius
        d = radius - sign * torch.sqrt(qx * qx + qy * qy)
        return radius * torch.atan2(sign * qx, -sign * qy), d

    def pose(self, scene: dict, f: int | float) -> torch.Tensor:
        """World pose (x, y, yaw) of the ego at frame f (float64): yaw = the road's heading + the lane-change
        angle."""
        s, d, ds, dd = (t[0, 0] for t in move(scene["ego"], torch.tensor([float(f)])))
        x, y = self.to_world(scene["radius"], s, d)
        yaw = s / scene["radius"] + torch.atan2(dd, ds * (1 - d / scene["radius"]))
        return torch.stack([x, y, yaw])

    def relative(self, scene: dict, f: int, origin_frame: int) -> torch.Tensor:
        """[4, 4] pose of frame f's ego in the ego frame of ``origin_frame`` (float32)."""
        a, b = self.pose(scene, origin_frame), self.pose(scene, f)
        c, s = math.cos(float(a[2])), math.sin(float(a[2]))
        dx, dy = float(b[0] - a[0]), float(b[1] - a[1])
        yaw = float(b[2] - a[2])
        m = torch.eye(4)
        m[:2, :2] = torch.tensor([[math.cos(yaw), -math.sin(yaw)], [math.sin(yaw), math.cos(yaw)]])
        m[0, 3], m[1, 3] = c * dx + s * dy, -s * dx + c * dy
        return m

    def _road_coords(self, scene: dict, points: torch.Tensor, origin_frame: int):
        """Ego-frame points [..., >=2] of ``origin_frame`` -> road (s, d) (float64)."""
        x0, y0, yaw = self.pose(scene, origin_frame)
        px, py = points[..., 0].double(), points[..., 1].double()
        wx = x0 + torch.cos(yaw) * px - torch.sin(yaw) * py
        wy = y0 + torch.sin(yaw) * px + torch.cos(yaw) * py
        return self.to_road(scene["radius"], wx, wy)

    def _cars(self, scene: dict, s: torch.Tensor, d: torch.Tensor, f: int) -> torch.Tensor:
        """Where road points (s, d) [...] fall in a car's footprint at frame f: bool [...]."""
        if not len(scene["agents"]):
            return torch.zeros_like(s, dtype=torch.bool)
        sa, da = (t[:, 0] for t in move(scene["agents"], torch.tensor([float(f)]))[:2])
        inside = ((s[..., None] - sa).abs() < CAR_SIZE[0] / 2) & ((d[..., None] - da).abs() < CAR_SIZE[1] / 2)
        return inside.any(-1)

    # -- labels -----------------------------------------------------------------------------------------------
    def occupancy(self, scene: dict, f: int, origin_frame: int | None = None) -> torch.Tensor:
        """Semantic grid [X, Y, Z] of frame f, in the ego frame of ``origin_frame`` (default f)."""
        o = f if origin_frame is None else origin_frame
        s, d = self._road_coords(scene, self.centres, o)
        z = self.centres[..., 2]
        ground = torch.where(d.abs() < LANE, 0, 2)
        occ = torch.where(z < 0.0, ground, torch.full_like(ground, len(CLASSES) - 1))
        st = scene["statics"]
        for cls in (2, 1):  # buildings over trees
            b = st[st[:, 5] == cls]
            if len(b):
                sv, dv, zv = s[..., None], d[..., None], z[..., None]
                inside = (sv >= b[:, 0]) & (sv < b[:, 1]) & (dv >= b[:, 2]) & (dv < b[:, 3]) & (zv >= 0)
                inside = inside & (zv < b[:, 4])
                inside = inside.any(-1)
                occ = torch.where(inside, torch.full_like(occ, cls), occ)
        cars = self._cars(scene, s, d, f) & (z >= 0) & (z < CAR_SIZE[2])
        return torch.where(cars, torch.full_like(occ, 3), occ)

    def agent_bev(self, scene: dict, f: int, origin_frame: int, extent: tuple[float, ...], cells: int) -> torch.Tensor:
        """The other cars' boxes at frame f on a BEV raster of the ego frame of ``origin_frame``: ``cells`` x
        ``cells`` cells over ``extent`` = (x0, y0, x1, y1); bool [cells, cells] (the ST-P3 collision target)."""
        xs = extent[0] + (extent[2] - extent[0]) * (torch.arange(cells) + 0.5) / cells
        ys = extent[1] + (extent[3] - extent[1]) * (torch.arange(cells) + 0.5) / cells
        pts = torch.stack(torch.meshgrid(xs, ys, indexing="ij"), -1)
        s, d = self._road_coords(scene, pts, origin_frame)
        return self._cars(scene, s, d, f)

    def ego_state(self, scene: dict, f: int, history: int = 7) -> torch.Tensor:
        """(vx, vy, yaw rate) per frame at frames f, f-1, ..., f-history+1, in the ego frame of f (as the nuScenes
        loader builds it): [3 * history]."""
        rel = [self.relative(scene, f - h, f) for h in range(history + 1)]
        out = []
        for h in range(history):
            a, b = rel[h], rel[h + 1]
            yaw = math.atan2(float(a[1, 0]), float(a[0, 0])) - math.atan2(float(b[1, 0]), float(b[0, 0]))
            out += [float(a[0, 3] - b[0, 3]), float(a[1, 3] - b[1, 3]), yaw]
        return torch.tensor(out)

    def waypoints(self, scene: dict, f: int, horizon: int) -> torch.Tensor:
        """Future ego positions of frames f+1..f+K in the ego frame of f: [K, 2]."""
        return self.ego_poses(scene, f, horizon)[1:, :2, 3].reshape(horizon, 2)

    def ego_poses(self, scene: dict, f: int, horizon: int) -> torch.Tensor:
        """Poses [K + 1, 4, 4] of the egos of frames f..f+K in the ego frame of f (the first is the identity)."""
        return torch.stack([self.relative(scene, f + k, f) for k in range(horizon + 1)])
