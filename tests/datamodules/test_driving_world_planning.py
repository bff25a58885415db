"""The embedded driving world is one where planning can fail: the ego turns (curved roads) and
changes lanes, other cars move and change lanes, and constant velocity collides under ST-P3's box definition at a
rate of a few percent while the driven trajectory does not."""

from __future__ import annotations

import torch

from datamodules.driving_world import DrivingWorld
from datamodules.nuscenes import NuScenesDataModule
from lightning_modules.preworld.metrics import ego_box_collisions, horizon_average, stp3_collisions

EXTENT = (-12.0, -12.0, 12.0, 12.0)


def test_world_turns_changes_lanes_and_moves_other_agents():
    world = DrivingWorld(seed=0)
    scenes = [world.scene(i, 7) for i in range(12)]
    kinds = {sc["behaviour"] for sc in scenes}
    assert {"brake", "lane_change"} <= kinds
    yaw_rates = torch.stack([world.ego_state(sc, 2)[2::3] for sc in scenes])
    assert (yaw_rates.abs() > 0.01).float().mean() > 0.5  # the ego turns: curved roads and lane changes
    agents = torch.cat([sc["agents"] for sc in scenes])
    assert (agents[:, 1] > 0).sum() >= 12 and (agents[:, 5] != agents[:, 6]).any()  # moving, lane-changing cars
    # the ego frame rotates with the ego: a future waypoint's direction follows the heading, not the world x axis
    sc = next(s for s in scenes if abs(s["radius"]) < 40)
    rel = world.relative(sc, 3, 0)
    assert abs(float(torch.atan2(rel[1, 0], rel[0, 0]))) > 0.05


def test_constant_velocity_collides_at_a_few_percent_and_the_driven_path_does_not():
    world = DrivingWorld(seed=0)
    cv_col, gt_col = [], []
    for i in range(20):
        sc = world.scene(i, 7)
        for f in range(4):
            state, gt = world.ego_state(sc, f), world.waypoints(sc, f, 3)
            cv = state[:2][None] * torch.arange(1, 4)[:, None]
            agents = torch.stack([world.agent_bev(sc, f + k, f, EXTENT, 96) for k in (1, 2, 3)])[None]
            cv_col.append(stp3_collisions(cv[None], gt[None], agents, torch.tensor(EXTENT))[0])
            gt_col.append(ego_box_collisions(gt[None], agents, torch.tensor(EXTENT))[0])
    rate = horizon_average(torch.stack(cv_col).mean(0))
    assert float(rate.mean()) >= 0.03, rate  # ST-P3 average over 1..3 steps, mean over the horizons
    assert float(torch.stack(gt_col).mean()) <= 0.02


def test_items_carry_ego_poses_and_the_agents_map():
    dm = NuScenesDataModule(n_scenes=3, frames_per_scene=2, horizon=2, batch_size=2)
    dm.setup("fit")
    it = dm.datasets["train"][0]
    assert it["ego_poses"].shape == (3, 4, 4) and torch.allclose(it["ego_poses"][0], torch.eye(4))
    assert torch.allclose(it["ego_poses"][1:, :2, 3], it["waypoints"])
    assert it["agents"].shape == (2, 96, 96) and it["agents"].dtype == torch.bool
    assert it["agents_range"].tolist() == [-12.0, -12.0, 12.0, 12.0]
    # the agents' map is the cars of the future occupancy seen from the current frame (sampled at voxel centres)
    world = DrivingWorld(seed=0)
    hits = 0
    for i in range(6):
        sc = world.scene(i, 4)
        for k in (1, 2, 3):
            bev = world.agent_bev(sc, k, 0, (-8.0, -8.0, 8.0, 8.0), 16)
            cars = world.occupancy(sc, k, origin_frame=0)[..., 1] == 3  # z = 0.5 m, inside every car
            assert torch.equal(bev, cars)
            hits += int(bev.sum())
    assert hits > 0
