"""nuScenes + Occ3D for 3D occupancy and its forecasting (PreWorld), and the embedded procedural driving world.

``source=real`` reads a nuScenes root through ``nuscenes-devkit`` (``NuScenes(version, dataroot)``): the tables,
camera images, calibrations, ego poses and LiDAR sweeps (projected into the cameras: the 2D rays of the rendering
losses, as RenderOcc/PreWorld build them; semantics from nuScenes-lidarseg when ``lidarseg/`` exists), and Occ3D
occupancy labels from ``<data_dir>/<occ_dir>/<scene name>/<sample token>/labels.npz`` (``semantics``,
``mask_lidar``, ``mask_camera`` on the 200 x 200 x 16 grid). A sample needs ``horizon`` future key frames in its
scene for forecasting; samples without them are skipped and counted (``skipped_no_future``).

``source=embedded`` generates :class:`datamodules.driving_world.DrivingWorld` scenes (documented there) with the
same item layout. Items (F = horizon + 1 frames: the current one and its futures, each in its own ego frame):

    img [N, 3, H, W]  intrins [N, 3, 3]  cam2ego [N, 4, 4]              cameras of the current frame
    rays_o, rays_d [F, R, 3]  ray_depth [F, R]  ray_sem [F, R] (255 = none)  ray_rgb [F, R, 3]  ray_valid [F, R]
    occ [F, X, Y, Z] (num_classes - 1 = free)  mask_camera [F, X, Y, Z]  labelled (has 3D labels, bool)
    ego_state [21] (vx, vy, yaw rate at 7 frames)  waypoints [K, 2]  ego_poses [F, 4, 4] (each frame's ego in the
    current ego frame: the warped copy-last)  obstacles [K, X, Y] (future non-drivable columns in the current ego
    frame: the point collision form)  agents [K, H, W] + agents_range [4] (x0, y0, x1, y1): the other agents' boxes
    in the current ego frame on a BEV raster (ST-P3's box collision target; real data: Occ3D's agent-class columns)

Semi-supervision: ``label_fraction`` of the training scenes keep their 3D labels (a seeded choice of scenes);
``train_split=labelled`` trains on those only (the fine-tuning and from-scratch budget), ``all`` on every scene.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from core.errors import ConfigError, DataFormatError, MissingDataError
from datamodules._base import SuiteDataModule, require_files, seeded_permutation
from datamodules.driving_world import CLASSES, PALETTE, SKY, DrivingWorld, camera_rig, cast_rays, pixel_rays

DEVKIT = "nuscenes-devkit==1.2.0"
TABLES = (
    "category",
    "attribute",
    "visibility",
    "instance",
    "sensor",
    "calibrated_sensor",
    "ego_pose",
    "log",
    "scene",
    "sample",
    "sample_data",
    "sample_annotation",
    "map",
)
CAMERAS = ("CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT", "CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT")
# nuScenes-lidarseg's 32 classes -> Occ3D's 17 (0 others ... 16 vegetation); 255 = not a training class.
LIDARSEG_TO_OCC3D = np.full(32, 255, dtype=np.int64)
for _src, _dst in {
    2: 7,
    3: 7,
    4: 7,
    6: 7,
    9: 1,
    12: 8,
    14: 2,
    15: 3,
    16: 3,
    17: 4,
    18: 5,
    21: 6,
    22: 9,
    23: 10,
    24: 11,
    25: 12,
    26: 13,
    27: 14,
    28: 15,
    30: 16,
}.items():
    LIDARSEG_TO_OCC3D[_src] = _dst
OCC3D_DRIVABLE = (11, 12, 13, 14)  # flat classes: not obstacles for the collision rate
# Occ3D's agents (bicycle, bus, car, construction vehicle, motorcycle, pedestrian, trailer, truck): their voxel
# columns stand in for the annotated boxes ST-P3 rasterises for its collision rate
OCC3D_AGENTS = (2, 3, 4, 5, 6, 7, 9, 10)
HOW_TO_GET = (
    "Get nuScenes (v1.0-trainval or v1.0-mini: tables, samples/, sweeps/, maps/, lidarseg/) from nuscenes.org and "
    "Occ3D-nuScenes gts/ from github.com/Tsinghua-MARS-Lab/Occ3D into data.data_dir; it is read with " + DEVKIT
)


class OccupancyDataset(Dataset):
    """Items stored as a list of dicts of tensors (built once in ``setup``)."""

    def __init__(self, items: list[dict]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def _pad_rays(rays: dict, max_rays: int, gen: torch.Generator) -> dict:
    n = rays["ray_depth"].shape[0]
    idx = torch.randperm(n, generator=gen)[:max_rays] if n > max_rays else torch.arange(n)
    out = {}
    for k, v in rays.items():
        pad = torch.zeros((max_rays - idx.numel(), *v.shape[1:]), dtype=v.dtype)
        if k == "ray_sem":
            pad.fill_(255)
        out[k] = torch.cat([v[idx], pad])
    return out


class NuScenesDataModule(SuiteDataModule):
    """nuScenes/Occ3D (real) or the procedural driving world (embedded) for occupancy world models.

    Args:
        version: nuScenes version folder (``v1.0-trainval``, ``v1.0-mini``).
        cameras: Camera channels (real data).
        occ_dir: Occ3D labels folder under ``data_dir``.
        image_size: (H, W) of the network input.
        grid: Label grid (X, Y, Z); Occ3D's is (200, 200, 16).
        pc_range: Metres (x0, y0, z0, x1, y1, z1) of the grid.
        num_classes: Classes including the last, free (Occ3D: 18).
        horizon: Future frames per item (K).
        max_rays: Rays kept per frame (LiDAR points; embedded: pixels).
        max_depth: Rays farther than this are dropped (official: 52 m).
        n_cams: Cameras of the embedded world.
        n_scenes: Embedded scenes (train/val/test = 70/15/15 %).
        frames_per_scene: Embedded items per scene.
        label_fraction: Fraction of training scenes with 3D labels.
        train_split: ``all`` or ``labelled``.
        val_split_fraction: Real data: fraction of scenes for validation and for test each.
    """

    def __init__(
        self,
        source: str = "embedded",
        data_dir: str = "data",
        batch_size: int = 8,
        num_workers: int = 0,
        seed: int = 0,
        version: str = "v1.0-mini",
        cameras: list[str] | tuple[str, ...] = CAMERAS,
        occ_dir: str = "gts",
        image_size: tuple[int, int] = (16, 32),
        grid: tuple[int, int, int] = (16, 16, 4),
        pc_range: tuple[float, ...] = (-8.0, -8.0, -1.0, 8.0, 8.0, 3.0),
        num_classes: int = 5,
        horizon: int = 3,
        max_rays: int = 1024,
        max_depth: float = 52.0,
        n_cams: int = 2,
        n_scenes: int = 60,
        frames_per_scene: int = 4,
        label_fraction: float = 0.1,
        train_split: str = "all",
        val_split_fraction: float = 0.15,
    ) -> None:
        super().__init__(source, data_dir, batch_size, num_workers, seed)
        if train_split not in ("all", "labelled"):
            raise ConfigError(f"data.train_split={train_split!r} must be 'all' or 'labelled'")
        if not 0.0 < label_fraction <= 1.0:
            raise ConfigError(f"data.label_fraction={label_fraction} must be in (0, 1]")
        if horizon < 0 or len(grid) != 3 or len(pc_range) != 6 or len(image_size) != 2:
            raise ConfigError("data.horizon must be >= 0, data.grid 3 ints, data.pc_range 6 floats, image_size 2")
        if source == "embedded" and num_classes != len(CLASSES):
            raise ConfigError(f"data.num_classes={num_classes} must be {len(CLASSES)} for the embedded world")
        self.version, self.cameras, self.occ_dir = version, list(cameras), occ_dir
        self.image_size, self.grid, self.pc_range = tuple(image_size), tuple(grid), tuple(pc_range)
        self.num_classes, self.horizon, self.max_rays, self.max_depth = num_classes, horizon, max_rays, max_depth
        self.n_cams, self.n_scenes, self.frames_per_scene = n_cams, n_scenes, frames_per_scene
        self.label_fraction, self.train_split, self.val_split_fraction = label_fraction, train_split, val_split_fraction
        self.skipped_no_future = 0

    # -- shared -----------------------------------------------------------------------------------------------
    def _splits(self, scene_items: list[list[dict]]) -> dict:
        n = len(scene_items)
        perm = seeded_permutation(n, self.seed).tolist()
        n_val = max(1, int(round(self.val_split_fraction * n))) if n >= 3 else 0
        test, val, train = perm[:n_val], perm[n_val : 2 * n_val], perm[2 * n_val :] or perm[:1]
        n_lab = max(1, int(round(self.label_fraction * len(train))))
        labelled = set(train[:n_lab])
        for s in train:
            for it in scene_items[s]:
                it["labelled"] = torch.tensor(s in labelled)
        pick = [s for s in train if self.train_split == "all" or s in labelled]
        flat = lambda ids: [it for s in ids for it in scene_items[s]]  # noqa: E731
        return {
            "train": OccupancyDataset(flat(pick)),
            "val": OccupancyDataset(flat(val or train[:1])),
            "test": OccupancyDataset(flat(test or train[:1])),
        }

    # -- embedded ---------------------------------------------------------------------------------------------
    def load_embedded(self) -> dict:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # small tensors: one thread is faster than several on a shared machine
        try:
            return self._generate()
        finally:
            torch.set_num_threads(threads)

    def _generate(self) -> dict:
        world = DrivingWorld(self.grid, self.pc_range, seed=self.seed)
        h, w = self.image_size
        intrins, cam2ego = camera_rig(self.n_cams, h, w)
        ro, rd = pixel_rays(intrins, cam2ego, h, w)
        gen = torch.Generator().manual_seed(self.seed)
        empty = self.num_classes - 1
        reach = float(torch.tensor(self.pc_range).abs().view(2, 3).max(0).values.norm())  # farthest grid corner
        # the agents' BEV (ST-P3 collision target) reaches 1.5x the grid at 4x its resolution, so that the ego box
        # at the last waypoint stays on it
        x0, y0, _, x1, y1, _ = self.pc_range
        extent = (1.5 * x0, 1.5 * y0, 1.5 * x1, 1.5 * y1)
        cells = 6 * self.grid[0]
        scenes = []
        for s in range(self.n_scenes):
            sc = world.scene(s, self.frames_per_scene + self.horizon)
            frames = {}
            for f in range(self.frames_per_scene + self.horizon):
                occ = world.occupancy(sc, f)
                depth, cls, hit, vis = cast_rays(occ, ro, rd, self.pc_range, reach, step=0.1)
                shade = 0.85 + 0.15 * torch.sin(hit.float() * 12.9898 + s).abs()
                fog = torch.exp(-depth / 12.0)[:, None]
                base = PALETTE[cls.clamp_min(0)] * shade[:, None]
                rgb = torch.where((cls >= 0)[:, None], base * fog + SKY * (1 - fog), SKY.expand_as(base))
                rgb = (rgb + 0.02 * torch.randn(rgb.shape, generator=gen)).clamp(0, 1)
                rays = {
                    "rays_o": ro,
                    "rays_d": rd,
                    "ray_depth": depth,
                    "ray_rgb": rgb,
                    "ray_valid": cls >= 0,
                    "ray_sem": torch.where(cls >= 0, cls, torch.full_like(cls, 255)),
                }
                frames[f] = (occ, vis, _pad_rays(rays, self.max_rays, gen), rgb)
            items = []
            for f in range(self.frames_per_scene):
                fut = range(f, f + self.horizon + 1)
                img = frames[f][3].reshape(self.n_cams, h, w, 3).permute(0, 3, 1, 2).contiguous()
                obst = (
                    torch.stack(
                        [_obstacle_bev(world.occupancy(sc, f + k, origin_frame=f), (0,), empty) for k in fut[1:]]
                    )
                    if self.horizon
                    else torch.zeros(0, *self.grid[:2], dtype=torch.bool)
                )
                agents = (
                    torch.stack([world.agent_bev(sc, f + k, f, extent, cells) for k in fut[1:]])
                    if self.horizon
                    else torch.zeros(0, cells, cells, dtype=torch.bool)
                )
                item = {
                    "img": img,
                    "intrins": intrins,
                    "cam2ego": cam2ego,
                    "occ": torch.stack([frames[k][0] for k in fut]),
                    "mask_camera": torch.stack([frames[k][1] for k in fut]),
                    "ego_state": world.ego_state(sc, f),
                    "waypoints": world.waypoints(sc, f, self.horizon),
                    "ego_poses": world.ego_poses(sc, f, self.horizon),
                    "obstacles": obst,
                    "agents": agents,
                    "agents_range": torch.tensor(extent),
                    "labelled": torch.tensor(True),
                }
                for key in frames[f][2]:
                    item[key] = torch.stack([frames[k][2][key] for k in fut])
                items.append(item)
            scenes.append(items)
        return self._splits(scenes)

    # -- real -------------------------------------------------------------------------------------------------
    def load_real(self) -> dict:
        root = Path(self.data_dir)
        require_files(root, [f"{self.version}/{t}.json" for t in TABLES], HOW_TO_GET)
        try:
            from nuscenes.nuscenes import NuScenes
        except ImportError as err:
            raise MissingDataError(f"data.source=real needs {DEVKIT} ({err}); `make install` installs it") from None
        try:
            nusc = NuScenes(version=self.version, dataroot=str(root), verbose=False)
        except Exception as err:  # noqa: BLE001 - name the table the devkit could not read
            raise DataFormatError(_bad_table_message(root / self.version, err)) from None
        reader = _NuScenesReader(nusc, self, root)
        scenes, self.skipped_no_future = [], 0
        for scene in nusc.scene:
            tokens = reader.scene_samples(scene)
            items = []
            for i in range(len(tokens)):
                if i + self.horizon >= len(tokens):
                    self.skipped_no_future += 1
                    continue
                items.append(reader.item(scene, tokens, i))
            if items:
                scenes.append(items)
        if not scenes:
            raise DataFormatError(
                f"{root / self.version}/sample.json: no sample has {self.horizon} future key frames "
                f"({self.skipped_no_future} skipped); lower data.horizon"
            )
        return self._splits(scenes)


def _bad_table_message(folder: Path, err: BaseException) -> str:
    import json

    for name in TABLES:
        path = folder / f"{name}.json"
        try:
            with open(path, encoding="utf-8") as f:
                json.load(f)
        except (ValueError, OSError) as bad:
            return f"{path}: not a nuScenes table ({type(bad).__name__}); expected the JSON tables {DEVKIT} reads"
    reason = " ".join(str(err).split())[:160] or type(err).__name__
    return f"{folder}: {DEVKIT} cannot load these tables ({type(err).__name__}: {reason})"


def _obstacle_bev(occ: torch.Tensor, drivable: tuple[int, ...], empty: int) -> torch.Tensor:
    """Columns [X, Y] holding any class that is neither free nor drivable."""
    obst = occ != empty
    for c in drivable:
        obst &= occ != c
    return obst.any(-1)


def _class_bev(occ: torch.Tensor, classes: tuple[int, ...]) -> torch.Tensor:
    """Columns [X, Y] holding any of ``classes``."""
    return torch.isin(occ, torch.tensor(classes)).any(-1)


class _NuScenesReader:
    """Reads one item of a nuScenes scene through the devkit (kept apart from the DataModule for clarity)."""

    def __init__(self, nusc, dm: NuScenesDataModule, root: Path) -> None:
        self.nusc, self.dm, self.root = nusc, dm, root
        self.gen = torch.Generator().manual_seed(dm.seed)
        self.has_lidarseg = hasattr(nusc, "lidarseg")

    def scene_samples(self, scene: dict) -> list[str]:
        tokens, tok = [], scene["first_sample_token"]
        while tok:
            tokens.append(tok)
            tok = self.nusc.get("sample", tok)["next"]
        return tokens

    def _file(self, rel: str) -> Path:
        path = self.root / rel
        if not path.exists():
            raise MissingDataError(
                f"missing data file(s): {path} (named in {self.dm.version}/sample_data.json). {HOW_TO_GET}"
            )
        return path

    def _pose(self, sample_token: str) -> np.ndarray:
        from nuscenes.utils.geometry_utils import transform_matrix
        from pyquaternion import Quaternion

        sd = self.nusc.get("sample_data", self.nusc.get("sample", sample_token)["data"]["LIDAR_TOP"])
        pose = self.nusc.get("ego_pose", sd["ego_pose_token"])
        return transform_matrix(pose["translation"], Quaternion(pose["rotation"]))  # ego -> global

    def _occ(self, scene: dict, token: str):
        path = self.root / self.dm.occ_dir / scene["name"] / token / "labels.npz"
        if not path.exists():
            raise MissingDataError(f"missing data file(s): {path}. {HOW_TO_GET}")
        with np.load(path) as z:
            sem, cam = z["semantics"], z["mask_camera"]
        if tuple(sem.shape) != self.dm.grid or tuple(cam.shape) != self.dm.grid:
            raise DataFormatError(f"{path}: Occ3D grid {tuple(sem.shape)} does not match data.grid={self.dm.grid}")
        return torch.from_numpy(sem.astype(np.int64)), torch.from_numpy(cam.astype(bool))

    def _rays(self, token: str) -> dict:
        """LiDAR points of the key frame projected into each camera: rays from the camera centre (ego frame)."""
        from nuscenes.utils.data_classes import LidarPointCloud
        from nuscenes.utils.geometry_utils import transform_matrix
        from PIL import Image
        from pyquaternion import Quaternion

        nusc, dm = self.nusc, self.dm
        sample = nusc.get("sample", token)
        lidar = nusc.get("sample_data", sample["data"]["LIDAR_TOP"])
        cs = nusc.get("calibrated_sensor", lidar["calibrated_sensor_token"])
        pc = LidarPointCloud.from_file(str(self._file(lidar["filename"])))
        pts = transform_matrix(cs["translation"], Quaternion(cs["rotation"])) @ np.vstack(
            [pc.points[:3], np.ones(pc.points.shape[1])]
        )
        labels = np.full(pc.points.shape[1], 255, dtype=np.int64)
        if self.has_lidarseg:
            rec = nusc.get("lidarseg", sample["data"]["LIDAR_TOP"])
            raw = np.fromfile(self._file(rec["filename"]), dtype=np.uint8)
            labels = LIDARSEG_TO_OCC3D[raw.clip(0, 31)]
        out = {k: [] for k in ("rays_o", "rays_d", "ray_depth", "ray_sem", "ray_rgb")}
        for cam in dm.cameras:
            sd = nusc.get("sample_data", sample["data"][cam])
            ccs = nusc.get("calibrated_sensor", sd["calibrated_sensor_token"])
            c2e = transform_matrix(ccs["translation"], Quaternion(ccs["rotation"]))
            cam_pts = np.linalg.inv(c2e) @ pts
            k = np.asarray(ccs["camera_intrinsic"])
            with Image.open(self._file(sd["filename"])) as im:
                rgb = np.asarray(im.convert("RGB"), dtype=np.float32) / 255.0
            z = cam_pts[2]
            uv = (k @ cam_pts[:3])[:2] / np.maximum(z, 1e-6)
            ok = (z > 0.1) & (uv[0] >= 0) & (uv[0] < rgb.shape[1]) & (uv[1] >= 0) & (uv[1] < rgb.shape[0])
            vec = pts[:3, ok].T - c2e[:3, 3]
            dist = np.linalg.norm(vec, axis=1)
            keep = dist <= dm.max_depth
            out["rays_o"].append(np.broadcast_to(c2e[:3, 3], (int(keep.sum()), 3)))
            out["rays_d"].append(vec[keep] / dist[keep, None])
            out["ray_depth"].append(dist[keep])
            out["ray_sem"].append(labels[ok][keep])
            px = uv[:, ok][:, keep].astype(int)
            out["ray_rgb"].append(rgb[px[1], px[0]])
        rays = {
            k: torch.from_numpy(np.concatenate(v)).to(torch.int64 if k == "ray_sem" else torch.float32)
            for k, v in out.items()
        }
        rays["ray_valid"] = torch.ones(rays["ray_depth"].shape[0], dtype=torch.bool)
        return _pad_rays(rays, dm.max_rays, self.gen)

    def _cameras(self, token: str):
        from nuscenes.utils.geometry_utils import transform_matrix
        from PIL import Image
        from pyquaternion import Quaternion

        h, w = self.dm.image_size
        imgs, ks, mats = [], [], []
        sample = self.nusc.get("sample", token)
        for cam in self.dm.cameras:
            if cam not in sample["data"]:
                raise DataFormatError(f"{self.root / self.dm.version}/sample_data.json: sample {token} has no {cam}")
            sd = self.nusc.get("sample_data", sample["data"][cam])
            cs = self.nusc.get("calibrated_sensor", sd["calibrated_sensor_token"])
            with Image.open(self._file(sd["filename"])) as im:
                im = im.convert("RGB")
                sx, sy = w / im.width, h / im.height
                imgs.append(torch.from_numpy(np.asarray(im.resize((w, h)), dtype=np.float32) / 255.0).permute(2, 0, 1))
            k = torch.tensor(cs["camera_intrinsic"], dtype=torch.float32)
            ks.append(torch.diag(torch.tensor([sx, sy, 1.0])) @ k)
            mats.append(torch.from_numpy(transform_matrix(cs["translation"], Quaternion(cs["rotation"]))).float())
        return torch.stack(imgs), torch.stack(ks), torch.stack(mats)

    def item(self, scene: dict, tokens: list[str], i: int) -> dict:
        dm, empty = self.dm, self.dm.num_classes - 1
        fut = tokens[i : i + dm.horizon + 1]
        img, intrins, cam2ego = self._cameras(tokens[i])
        occs = [self._occ(scene, t) for t in fut]
        rays = [self._rays(t) for t in fut]
        poses = [self._pose(tokens[max(j, 0)]) for j in range(i - 7, i + dm.horizon + 1)]
        cur_inv = np.linalg.inv(poses[7])
        rel = [cur_inv @ p for p in poses]  # every frame's ego in the current ego frame
        yaw = [np.arctan2(r[1, 0], r[0, 0]) for r in rel]
        state = []
        for h in range(7):
            a, b = rel[7 - h], rel[6 - h]
            state += [a[0, 3] - b[0, 3], a[1, 3] - b[1, 3], yaw[7 - h] - yaw[6 - h]]
        wps = torch.tensor(np.array([[r[0, 3], r[1, 3]] for r in rel[8:]]), dtype=torch.float32).reshape(-1, 2)
        obst, agents = [], []
        for k in range(1, dm.horizon + 1):
            obst.append(_warp_bev(_obstacle_bev(occs[k][0], OCC3D_DRIVABLE, empty), rel[7 + k], dm.grid, dm.pc_range))
            agents.append(_warp_bev(_class_bev(occs[k][0], OCC3D_AGENTS), rel[7 + k], dm.grid, dm.pc_range))
        none = torch.zeros(0, *dm.grid[:2], dtype=torch.bool)
        item = {
            "img": img,
            "intrins": intrins,
            "cam2ego": cam2ego,
            "occ": torch.stack([o[0] for o in occs]),
            "mask_camera": torch.stack([o[1] for o in occs]),
            "ego_state": torch.tensor(state, dtype=torch.float32),
            "waypoints": wps,
            "ego_poses": torch.tensor(np.stack(rel[7:]), dtype=torch.float32),
            "obstacles": torch.stack(obst) if obst else none,
            "agents": torch.stack(agents) if agents else none,
            "agents_range": torch.tensor([dm.pc_range[i] for i in (0, 1, 3, 4)], dtype=torch.float32),
            "labelled": torch.tensor(True),
        }
        for key in rays[0]:
            item[key] = torch.stack([r[key] for r in rays])
        return item


def _warp_bev(bev: torch.Tensor, future_in_current: np.ndarray, grid, pc_range) -> torch.Tensor:
    """Nearest-cell resampling of a future frame's BEV map [X, Y] into the current ego frame."""
    xs = np.linspace(pc_range[0], pc_range[3], grid[0], endpoint=False) + (pc_range[3] - pc_range[0]) / grid[0] / 2
    ys = np.linspace(pc_range[1], pc_range[4], grid[1], endpoint=False) + (pc_range[4] - pc_range[1]) / grid[1] / 2
    gx, gy = np.meshgrid(xs, ys, indexing="ij")
    pts = np.stack([gx.ravel(), gy.ravel(), np.zeros(gx.size), np.ones(gx.size)])
    fut = np.linalg.inv(future_in_current) @ pts
    ix = np.floor((fut[0] - pc_range[0]) / (pc_range[3] - pc_range[0]) * grid[0]).astype(int)
    iy = np.floor((fut[1] - pc_range[1]) / (pc_range[4] - pc_range[1]) * grid[1]).astype(int)
    ok = (ix >= 0) & (ix < grid[0]) & (iy >= 0) & (iy < grid[1])
    out = np.zeros(gx.size, dtype=bool)
    out[ok] = bev.numpy()[ix[ok], iy[ok]]
    return torch.from_numpy(out.reshape(grid[0], grid[1]))
