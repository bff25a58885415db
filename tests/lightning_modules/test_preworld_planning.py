"""PreWorld evaluation by the official and standard conventions: unmasked 4D mIoU beside
the camera-masked one, the ST-P3 planning metric (L2 and ego-box collisions averaged over the steps up to each
horizon), copy-last warped by the known ego poses (exact on a static world), and the pretrain-only zero IoU
explained."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from datamodules.driving_world import DrivingWorld
from datamodules.nuscenes import NuScenesDataModule
from lightning_modules.preworld import PreWorldLitModule
from lightning_modules.preworld.metrics import (
    collisions,
    ego_box_collisions,
    horizon_average,
    iou_from_confusion,
    stp3_collisions,
    warp_occupancy,
)

PC = (-8.0, -8.0, -1.0, 8.0, 8.0, 3.0)
FREE = 4


@pytest.fixture(scope="module")
def batch():
    torch.set_num_threads(1)
    dm = NuScenesDataModule(n_scenes=3, frames_per_scene=2, horizon=2, batch_size=4)
    dm.setup("fit")
    return next(iter(torch.utils.data.DataLoader(dm.datasets["train"], batch_size=4)))


def _model(**kw) -> PreWorldLitModule:
    torch.manual_seed(0)
    args = dict(horizon=2, channels=8, context=8, depth_bins=8, encoder_width=8, n_rays=64, n_inner=16)
    args.update(kw)
    return PreWorldLitModule(**args)


def test_stp3_horizon_average_and_ego_box():
    assert horizon_average(torch.tensor([1.0, 2.0, 3.0, 6.0])).tolist() == [1.0, 1.5, 2.0, 3.0]
    ext = torch.tensor([-8.0, -8.0, 8.0, 8.0])
    agents = torch.zeros(1, 2, 64, 64, dtype=torch.bool)  # 0.25 m cells
    agents[0, 0, 41, 35] = True  # cell centre (2.375, 0.875): inside the box x in [-1.542, 2.542], |y| <= 0.925
    agents[0, 1, 43, 32] = True  # (2.875, 0.125): beyond the box's front edge at 2.542
    wps = torch.zeros(1, 2, 2)
    assert ego_box_collisions(wps, agents, ext).tolist() == [[1.0, 0.0]]
    assert ego_box_collisions(wps + torch.tensor([0.4, 0.0]), agents, ext).tolist() == [[1.0, 1.0]]
    # the point form misses what the box hits: the waypoint itself is on no agent cell
    assert collisions(wps, agents[:, :, ::4, ::4], PC).sum() == 0
    # ST-P3 does not count a step where the driven trajectory's box collides too
    assert stp3_collisions(wps + 0.4, wps, agents, ext).tolist() == [[0.0, 1.0]]


def test_warped_copy_is_exact_on_a_static_world_with_known_motion():
    world = DrivingWorld(seed=3)
    sc = world.scene(0, 4)
    sc["radius"], sc["agents"] = 1e9, sc["agents"][:0]  # a straight road, no other agents: a static world
    sc["ego"] = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0, -1.75, -1.75, 0.0, 1.0]])  # 1 m (one voxel) per frame
    now = world.occupancy(sc, 0)
    for k in (1, 2, 3):
        future, pose = world.occupancy(sc, k), world.relative(sc, k, 0)
        warped = warp_occupancy(now[None], pose[None], PC, FREE)[0]
        seen = slice(0, 16 - k)  # target voxels whose source lies in the current grid
        assert torch.equal(warped[seen], future[seen]) and (warped[16 - k :] == FREE).all()
        assert not torch.equal(now[seen], future[seen])  # the unwarped copy is not the future
    # a quarter turn plus a 2 m shift maps voxel centres onto voxel centres: target (i, j) <- source (17 - j, i)
    occ = torch.randint(0, 5, (16, 16, 4))
    pose = torch.eye(4)
    pose[:2, :2] = torch.tensor([[0.0, -1.0], [1.0, 0.0]])
    pose[0, 3] = 2.0
    got = warp_occupancy(occ[None], pose[None], PC, FREE)[0]
    i, j = torch.meshgrid(torch.arange(16), torch.arange(2, 16), indexing="ij")
    assert torch.equal(got[:, 2:], occ[17 - j, i]) and (got[:, :2] == FREE).all()


def _miou(pred, target):
    cm = torch.zeros(5, 5, dtype=torch.float64)
    cm.index_put_((target.reshape(-1), pred.reshape(-1)), torch.ones(pred.numel(), dtype=torch.float64), True)
    return float(iou_from_confusion(cm)["miou"])


def test_eval_reports_unmasked_4d_miou_stp3_planning_and_warped_copy_last(batch):
    m = _model()
    occ, mask = batch["occ"], batch["mask_camera"]
    # a forecaster right on camera-visible voxels and wrong (building) elsewhere: masked 1.0, unmasked lower
    preds = [occ[:, 0]] + [torch.where(mask[:, k], occ[:, k], torch.ones_like(occ[:, k])) for k in (1, 2)]
    gt = batch["waypoints"]
    err = torch.tensor([[[0.3, 0.4]], [[0.0, 1.0]]]).transpose(0, 1)  # step 1 off by 0.5 m, step 2 by 1 m more
    wps = gt + err.cumsum(1)
    offsets = torch.cat([wps[:, :1], wps[:, 1:] - wps[:, :-1]], 1)
    m.score(batch, "test", preds, offsets)
    out = m.epoch_metrics("test")
    assert math.isclose(float(out["miou_masked_h1"]), 1.0)
    assert math.isclose(float(out["miou_h1"]), _miou(preds[1], occ[:, 1]), rel_tol=1e-6) and out["miou_h1"] < 0.9
    # ST-P3: the value at horizon k is the mean over steps 1..k
    step = (wps - gt).norm(dim=-1).mean(0)
    assert math.isclose(float(out["l2_h1"]), float(step[0]), rel_tol=1e-5)
    assert math.isclose(float(out["l2_h2"]), float(step.mean()), rel_tol=1e-5)
    cv = batch["ego_state"][:, None, :2] * torch.tensor([1.0, 2.0])[None, :, None]
    cv_step = (cv - gt).norm(dim=-1).mean(0)
    assert math.isclose(float(out["l2_cv_h2"]), float(cv_step.mean()), rel_tol=1e-5)
    assert math.isclose(float(out["l2"]), float((step[0] + step.mean()) / 2), rel_tol=1e-5)
    assert {"col_h2", "col_cv_h2", "col_point_h2", "col_point_cv_h2"} <= out.keys()
    # copy-last: the current occupancy warped by the known poses beats copying it unwarped; with the ground-truth
    # current frame as the prediction, the standard copy-last equals the ground-truth upper reference
    assert math.isclose(float(out["miou_copy_last_h2"]), float(out["miou_copy_last_gt_h2"]))
    assert out["miou_copy_last_gt_h2"] > out["miou_copy_last_unwarped_h2"]
    # every metric was reset: a second epoch starts empty
    assert m.epoch_metrics("test") == {}


def test_pretrain_zero_iou_is_explained(batch, caplog):
    m = _model()
    with torch.no_grad():
        m.attrs.density[-2].bias.fill_(-100.0)  # no voxel reaches density_threshold: everything predicted free
    m._eval(batch, "val")
    with caplog.at_level(logging.WARNING, logger="lightning_modules.preworld.module"):
        m._log_epoch("val")
    assert "density_threshold=8.5" in caplog.text and "no voxel is predicted occupied" in caplog.text
