"""PreWorld's baselines scored through the module's evaluation on a hand-built batch with hand-computed answers:
copy-last warped by the known ego poses (a whole-voxel shift and quarter / half turns), its
ground-truth and unwarped twins, and the constant-velocity planner's L2 and point collisions."""

from __future__ import annotations

import pytest
import torch

from lightning_modules.preworld import PreWorldLitModule

FREE, X, Y, Z = 4, 16, 16, 4  # 1 m voxels over PreWorld's default (-8, -8, -1, 8, 8, 3) m grid
A, B = (10, 8, 1), (3, 12, 2)  # two occupied voxels of the current frame: class 0 at A, class 1 at B


def _occ(a: tuple[int, int, int], b: tuple[int, int, int], cls_b: int = 1) -> torch.Tensor:
    occ = torch.full((X, Y, Z), FREE, dtype=torch.long)
    occ[a], occ[b] = 0, cls_b
    return occ


def _pose(rot: list[list[float]], shift: tuple[float, float]) -> torch.Tensor:
    p = torch.eye(4)
    p[:2, :2], p[:2, 3] = torch.tensor(rot), torch.tensor(shift)
    return p


def _batch() -> dict[str, torch.Tensor]:
    """Item 0: a static world, the ego drives 1 m (one voxel) forward per frame, so a voxel at x index i now is at
    i - t at frame t. Item 1: the ego turns a quarter turn left (frame 1), then a half turn (frame 2) on the spot. A
    target voxel centre p is read at ``pose @ p`` of the current frame: a quarter turn maps (x, y) -> (-y, x), i.e.
    target (i, j) <- current (15 - j, i); a half turn target (i, j) <- current (15 - i, 15 - j). So A = (10, 8)
    lands at (8, 5) after the quarter turn and at (5, 7) after the half turn; B = (3, 12) at (12, 12) and (12, 3)."""
    ident, quarter, half = [[1.0, 0.0], [0.0, 1.0]], [[0.0, -1.0], [1.0, 0.0]], [[-1.0, 0.0], [0.0, -1.0]]
    occ = torch.stack(
        [
            torch.stack([_occ(A, B), _occ((9, 8, 1), (2, 12, 2)), _occ((8, 8, 1), (1, 12, 2))]),
            torch.stack([_occ(A, B), _occ((8, 5, 1), (12, 12, 2)), _occ((5, 7, 1), (12, 3, 2))]),
        ]
    )
    poses = torch.stack(
        [
            torch.stack([_pose(ident, (0.0, 0.0)), _pose(ident, (1.0, 0.0)), _pose(ident, (2.0, 0.0))]),
            torch.stack([_pose(ident, (0.0, 0.0)), _pose(quarter, (0.0, 0.0)), _pose(half, (0.0, 0.0))]),
        ]
    )
    # planning: item 0 last moved (2, 0.5) per frame but drives (2, 0) per frame; item 1 moves (0, 1) as it did
    ego_state = torch.zeros(2, 21)
    ego_state[0, :2], ego_state[1, :2] = torch.tensor([2.0, 0.5]), torch.tensor([0.0, 1.0])
    waypoints = torch.tensor([[[2.0, 0.0], [4.0, 0.0]], [[0.0, 1.0], [0.0, 2.0]]])
    obstacles = torch.zeros(2, 2, X, Y, dtype=torch.bool)
    obstacles[0, 1, 12, 9] = True  # the cell of (4, 1) m: constant velocity's second waypoint of item 0
    return {
        "occ": occ,
        "mask_camera": torch.ones(2, 3, X, Y, Z, dtype=torch.bool),
        "ego_poses": poses,
        "ego_state": ego_state,
        "waypoints": waypoints,
        "obstacles": obstacles,
    }


def test_copy_last_and_constant_velocity_match_hand_computed_values():
    torch.manual_seed(0)
    m = PreWorldLitModule(horizon=2, channels=8, context=8, depth_bins=8, encoder_width=8, n_rays=64, n_inner=16)
    batch = _batch()
    occ = batch["occ"]
    # the model's current frame is right except that B has class 2: the warped copy of it has IoU 1 on class 0 and
    # 0 on classes 1 (missed) and 2 (false), miou 1/3; the ground-truth copy-last is exact (miou 1)
    now = torch.stack([_occ(A, B, cls_b=2)] * 2)
    preds = [now, occ[:, 1], torch.full_like(now, FREE)]  # forecast: exact at step 1, all free at step 2
    offsets = torch.cat([batch["waypoints"][:, :1], batch["waypoints"].diff(dim=1)], 1)  # the model drives exactly
    m.score(batch, "test", preds, offsets)
    out = {k: float(v) for k, v in m.epoch_metrics("test").items()}
    for k in (1, 2):
        assert out[f"miou_copy_last_gt_h{k}"] == pytest.approx(1.0)
        assert out[f"miou_copy_last_h{k}"] == pytest.approx(1 / 3)
        # without the ego motion no object lands where it is at frame k (item 0 moved one voxel, item 1 turned)
        assert out[f"miou_copy_last_unwarped_h{k}"] == pytest.approx(0.0)
    assert out["miou"] == pytest.approx(1 / 3) and out["miou_h1"] == pytest.approx(1.0)
    assert out["miou_h2"] == pytest.approx(0.0)
    # constant velocity: k x the last displacement. Item 0: (2, 0.5), (4, 1) vs (2, 0), (4, 0) -> L2 0.5, 1.0 and
    # the second waypoint in the obstacle; item 1: exact. Per step over the batch: L2 (0.25, 0.5), collisions
    # (0, 0.5); ST-P3 averages over steps 1..k: L2 h1 0.25, h2 0.375, mean 0.3125; collisions h1 0, h2 0.25
    assert out["l2_cv_h1"] == pytest.approx(0.25) and out["l2_cv_h2"] == pytest.approx(0.375)
    assert out["l2_cv"] == pytest.approx(0.3125)
    assert out["col_point_cv_h1"] == pytest.approx(0.0) and out["col_point_cv_h2"] == pytest.approx(0.25)
    assert out["l2"] == pytest.approx(0.0) and out["col_point"] == pytest.approx(0.0)  # the driven path: no error
