"""nuScenes + Occ3D loader (through nuscenes-devkit) on a tiny dataset written in the exact table format, and the
embedded procedural driving world with its ray caster."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import DataFormatError, MissingDataError
from datamodules.driving_world import DrivingWorld, camera_rig, cast_rays, pixel_rays
from datamodules.nuscenes import NuScenesDataModule
from suite.build import check_model_fits_data
from tests.conftest import ROOT, compose_train

CAMS = ("CAM_FRONT", "CAM_BACK")
GRID = (8, 8, 2)
PC = (-8.0, -8.0, -1.0, 8.0, 8.0, 3.0)


def _quat(r: np.ndarray) -> list[float]:
    from pyquaternion import Quaternion

    return list(Quaternion(matrix=r).elements)


def write_nuscenes(root: Path, n_samples: int = 3, version: str = "v1.0-mini", grid=GRID, lidarseg: bool = True):
    """One scene of ``n_samples`` key frames, LIDAR_TOP + two cameras (front, back), ego moving 1 m per sample
    along x, nuScenes-lidarseg labels and Occ3D labels.npz of shape ``grid``."""
    from PIL import Image

    tab = root / version
    tab.mkdir(parents=True, exist_ok=True)
    (root / "maps").mkdir(exist_ok=True)
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(root / "maps" / "m.png")
    cam_r = np.array([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])
    back = np.array([[-1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 1.0]]) @ cam_r
    k = [[20.0, 0.0, 32.0], [0.0, 20.0, 24.0], [0.0, 0.0, 1.0]]
    sensors = [{"token": "s_lidar", "channel": "LIDAR_TOP", "modality": "lidar"}]
    calib = [
        {
            "token": "c_lidar",
            "sensor_token": "s_lidar",
            "translation": [0.0, 0.0, 1.8],
            "rotation": [1.0, 0.0, 0.0, 0.0],
            "camera_intrinsic": [],
        }
    ]
    for cam, r in zip(CAMS, (cam_r, back)):
        sensors.append({"token": f"s_{cam}", "channel": cam, "modality": "camera"})
        calib.append(
            {
                "token": f"c_{cam}",
                "sensor_token": f"s_{cam}",
                "translation": [0.0, 0.0, 1.5],
                "rotation": _quat(r),
                "camera_intrinsic": k,
            }
        )
    cats = [
        {"token": "k0", "name": "noise", "description": "", "index": 0},
        {"token": "k17", "name": "vehicle.car", "description": "", "index": 17},
        {"token": "k24", "name": "flat.driveable_surface", "description": "", "index": 24},
    ]
    samples, sdata, poses, segs = [], [], [], []
    for i in range(n_samples):
        ts = 1_000_000 * i
        nxt = f"smp{i + 1}" if i < n_samples - 1 else ""
        samples.append(
            {
                "token": f"smp{i}",
                "timestamp": ts,
                "scene_token": "scene0",
                "prev": f"smp{i - 1}" if i else "",
                "next": nxt,
            }
        )
        for ch, ext in (("LIDAR_TOP", "pcd.bin"), *((c, "jpg") for c in CAMS)):
            tok = f"sd_{ch}_{i}"
            poses.append(
                {
                    "token": f"ep_{tok}",
                    "timestamp": ts,
                    "rotation": [1.0, 0.0, 0.0, 0.0],
                    "translation": [float(i), 0.0, 0.0],
                }
            )
            folder = root / "samples" / ch
            folder.mkdir(parents=True, exist_ok=True)
            rel = f"samples/{ch}/{tok}.{ext}"
            sdata.append(
                {
                    "token": tok,
                    "sample_token": f"smp{i}",
                    "ego_pose_token": f"ep_{tok}",
                    "calibrated_sensor_token": f"c_{'lidar' if ch == 'LIDAR_TOP' else ch}",
                    "timestamp": ts,
                    "fileformat": ext.split(".")[0],
                    "is_key_frame": True,
                    "height": 48,
                    "width": 64,
                    "filename": rel,
                    "prev": "",
                    "next": "",
                }
            )
            if ext == "jpg":
                Image.fromarray(np.full((48, 64, 3), 40 * (i + 1), np.uint8)).save(root / rel)
            else:  # a car 6 m ahead and road 6 m behind (lidar frame: 1.8 m above the ego origin)
                pts = np.array([[6.0, 0.0, -1.0, 1.0, 0.0], [-6.0, 0.5, -1.7, 1.0, 0.0], [0.0, 30.0, 0.0, 1.0, 0.0]])
                pts.astype(np.float32).tofile(root / rel)
                if lidarseg:
                    (root / "lidarseg" / version).mkdir(parents=True, exist_ok=True)
                    lab = f"lidarseg/{version}/{tok}_lidarseg.bin"
                    np.array([17, 24, 0], np.uint8).tofile(root / lab)
                    segs.append({"token": tok, "sample_data_token": tok, "filename": lab})
        occ = root / "gts" / "scene-0001" / f"smp{i}"
        occ.mkdir(parents=True, exist_ok=True)
        sem = np.full(grid, 17, np.uint8)
        sem[..., 0] = 11
        np.savez_compressed(
            occ / "labels.npz", semantics=sem, mask_lidar=np.ones(grid, np.uint8), mask_camera=np.ones(grid, np.uint8)
        )
    tables = {
        "category": cats,
        "attribute": [],
        "visibility": [],
        "instance": [],
        "sensor": sensors,
        "calibrated_sensor": calib,
        "ego_pose": poses,
        "log": [{"token": "log0", "logfile": "", "vehicle": "", "date_captured": "", "location": "boston"}],
        "scene": [
            {
                "token": "scene0",
                "log_token": "log0",
                "nbr_samples": n_samples,
                "first_sample_token": "smp0",
                "last_sample_token": f"smp{n_samples - 1}",
                "name": "scene-0001",
                "description": "",
            }
        ],
        "sample": samples,
        "sample_data": sdata,
        "sample_annotation": [],
        "map": [{"token": "map0", "log_tokens": ["log0"], "category": "semantic_prior", "filename": "maps/m.png"}],
    }
    if lidarseg:
        tables["lidarseg"] = segs
    for name, rows in tables.items():
        (tab / f"{name}.json").write_text(json.dumps(rows))


def _dm(root: Path, **kw) -> NuScenesDataModule:
    args = dict(
        source="real",
        data_dir=str(root),
        cameras=list(CAMS),
        grid=GRID,
        pc_range=PC,
        num_classes=18,
        horizon=1,
        max_rays=8,
        image_size=(12, 16),
        batch_size=1,
        label_fraction=1.0,
    )
    args.update(kw)
    return NuScenesDataModule(**args)


def test_real_format_reads_through_the_devkit(tmp_path):
    write_nuscenes(tmp_path, n_samples=3)
    dm = _dm(tmp_path)
    dm.setup("fit")
    assert dm.skipped_no_future == 1  # the last sample has no future key frame
    item = dm.datasets["train"][0]
    assert item["img"].shape == (2, 3, 12, 16) and item["occ"].shape == (2, *GRID)
    assert torch.allclose(item["intrins"][0, 0, 0], torch.tensor(20.0 * 16 / 64))
    ok = item["ray_valid"][0]
    assert int(ok.sum()) == 2  # the car point (front camera) and the road point (back); the 30 m side point: none
    depth, sem = item["ray_depth"][0][ok], item["ray_sem"][0][ok]
    car = sem == 4  # lidarseg 17 (vehicle.car) -> Occ3D 4
    assert car.sum() == 1 and math.isclose(float(depth[car]), math.hypot(6.0, 0.7), rel_tol=1e-5)
    assert set(sem.tolist()) == {4, 11}
    d = item["rays_d"][0][ok]
    assert torch.allclose(d.norm(dim=-1), torch.ones(2), atol=1e-5)
    assert torch.allclose(item["waypoints"], torch.tensor([[1.0, 0.0]]), atol=1e-5)  # 1 m ahead per sample
    assert torch.allclose(item["ego_state"][:2], torch.tensor([0.0, 0.0]))  # first sample: no past motion
    later = [it for it in dm.datasets["train"]]
    assert any(float(it["ego_state"][0]) > 0.99 for it in later) or len(later) == 1
    assert item["obstacles"].shape == (1, 8, 8) and not item["obstacles"].any()  # free above the road


def test_missing_table_names_it_and_the_devkit(tmp_path):
    write_nuscenes(tmp_path)
    (tmp_path / "v1.0-mini" / "ego_pose.json").unlink()
    with pytest.raises(MissingDataError, match=r"ego_pose\.json.*nuscenes-devkit==1\.2\.0"):
        _dm(tmp_path).setup("fit")


def test_missing_camera_file_and_wrong_occ3d_grid(tmp_path):
    write_nuscenes(tmp_path)
    (tmp_path / "samples" / "CAM_BACK" / "sd_CAM_BACK_0.jpg").unlink()
    with pytest.raises(MissingDataError, match="sd_CAM_BACK_0.jpg"):
        _dm(tmp_path).setup("fit")
    write_nuscenes(tmp_path, grid=(4, 4, 2))
    with pytest.raises(DataFormatError, match=r"labels\.npz: Occ3D grid \(4, 4, 2\)"):
        _dm(tmp_path).setup("fit")


def test_corrupt_table_is_named(tmp_path):
    write_nuscenes(tmp_path)
    (tmp_path / "v1.0-mini" / "sample.json").write_bytes(b"\x80\xff{")
    with pytest.raises(DataFormatError, match=r"sample\.json: not a nuScenes table"):
        _dm(tmp_path).setup("fit")


def test_too_short_scenes_are_reported(tmp_path):
    write_nuscenes(tmp_path, n_samples=2)
    with pytest.raises(DataFormatError, match="no sample has 3 future key frames"):
        _dm(tmp_path, horizon=3).setup("fit")


def test_ray_caster_hits_a_wall_at_the_right_distance():
    occ = torch.full((16, 16, 4), 4)
    occ[12:, :, 1:] = 1  # a building face at x = 4 m
    o, d = torch.tensor([[0.0, 0.0, 1.5]]), torch.tensor([[1.0, 0.0, 0.0]])
    depth, cls, _, vis = cast_rays(occ, o, d, PC, 12.0, step=0.05)
    assert abs(float(depth) - 4.0) < 0.06 and int(cls) == 1
    assert vis[8:13, 8, 2].all() and not vis[13:, 8, 2].any()  # seen up to and including the hit voxel


def test_embedded_world_is_consistent():
    dm = NuScenesDataModule(n_scenes=3, frames_per_scene=2, horizon=2, batch_size=2)
    dm.setup("fit")
    it = dm.datasets["train"][0]
    assert it["img"].shape == (2, 3, 16, 32) and it["occ"].shape == (3, 16, 16, 4)
    # every valid ray's class is the class of the voxel its hit point falls in
    ok = it["ray_valid"][0]
    hit = it["rays_o"][0][ok] + it["ray_depth"][0][ok, None] * it["rays_d"][0][ok]
    idx = torch.floor((hit - torch.tensor(PC[:3])) / 1.0).long().clamp(0, 15)
    idx[:, 2] = idx[:, 2].clamp(0, 3)
    got = it["occ"][0][idx[:, 0], idx[:, 1], idx[:, 2]]
    assert (got == it["ray_sem"][0][ok]).float().mean() > 0.97
    # the future frames differ (cars move, the ego moves) and waypoints follow the ego velocity
    assert not torch.equal(it["occ"][0], it["occ"][2])
    assert torch.allclose(
        it["waypoints"][0], it["ego_state"][:2] + (it["ego_state"][:2] - it["ego_state"][3:5]), atol=0.15
    )
    again = NuScenesDataModule(n_scenes=3, frames_per_scene=2, horizon=2, batch_size=2)
    again.setup("fit")
    assert torch.equal(again.datasets["train"][0]["img"], it["img"])


def test_label_fraction_picks_scenes_for_the_labelled_split():
    world = DrivingWorld()
    assert world.scene(0, 4)["agents"].shape[1] == 9  # (s0, v0, v1, t0, T, d0, d1, tl, Tl) per car
    k, c = camera_rig(4, 8, 16)
    o, d = pixel_rays(k, c, 8, 16)
    assert o.shape == (4 * 8 * 16, 3) and torch.allclose(d.norm(dim=-1), torch.ones(len(d)))
    dm = NuScenesDataModule(n_scenes=10, frames_per_scene=1, horizon=1, label_fraction=0.2, train_split="labelled")
    dm.setup("fit")
    full = NuScenesDataModule(n_scenes=10, frames_per_scene=1, horizon=1, label_fraction=0.2)
    full.setup("fit")
    assert len(dm.datasets["train"]) == 1 and len(full.datasets["train"]) == 6  # 2 val + 2 test scenes
    assert sum(bool(it["labelled"]) for it in full.datasets["train"]) == 1


def test_the_data_configs_are_named_for_what_they_load(tmp_path):
    world = compose_train(["experiment=preworld"], tmp_path)
    assert world.data.source == "embedded"  # preworld runs the driving world, data=driving_world
    real = compose_train(["experiment=preworld", "data=nuscenes"], tmp_path)
    assert real.data.source == "real" and real.data.data_dir.endswith("/nuscenes")
    assert {k: v for k, v in real.data.items() if k != "source"} == {
        k: v for k, v in world.data.items() if k != "source"
    }
    check_model_fits_data({"experiment": "preworld", "model": "preworld", "data": "nuscenes"}, ROOT / "conf")
