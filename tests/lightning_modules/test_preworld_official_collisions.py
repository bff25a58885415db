"""``ego_box_collisions(rule="official")`` against OccWorld's ``utils/metric_stp3.py`` box collision (the metric
PreWorld's planning table is computed with), on hand-made trajectories and an agent raster of the official layout.

The official arithmetic, restated here on its own raster: 200 x 200 cells of 0.5 m in the LiDAR frame (X right,
Y forward); the rasteriser puts the cell centred at (X, Y) at row ``100 - 2Y``, column ``100 + 2X``; the ego box
(4.084 x 1.85 m, 0.5 m ahead) is the integer points ``(u, v)`` inside it in the coordinates ``(a + 49.75) / 0.5``
(``a`` along the length, then the width), and at waypoint (X, Y) it reads row ``int(200 - (2Y + u))``, column
``int(2X + v)``, both clipped to the raster. The suite's frame is x forward, y left: X = -y, Y = x."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.errors import ConfigError
from lightning_modules.preworld.metrics import EGO_LENGTH, EGO_OFFSET, EGO_WIDTH, ego_box_collisions, stp3_collisions

N, CELL = 200, 0.5
SUITE_EXTENT = torch.tensor([-49.75, -49.75, 50.25, 50.25])  # the official raster's cells in the suite's frame


def official_hits(traj_xy: np.ndarray, seg: np.ndarray) -> list[bool]:
    """The official box collision per step: ``traj_xy`` [K, 2] (X, Y) LiDAR frame, ``seg`` [K, 200, 200]."""
    first = -50.0 + CELL / 2
    lo_u, hi_u = (-EGO_LENGTH / 2 + EGO_OFFSET - first) / CELL, (EGO_LENGTH / 2 + EGO_OFFSET - first) / CELL
    lo_v, hi_v = (-EGO_WIDTH / 2 - first) / CELL, (EGO_WIDTH / 2 - first) / CELL
    us = [u for u in range(N) if lo_u < u < hi_u]
    vs = [v for v in range(N) if lo_v < v < hi_v]
    assert (len(us), len(vs)) == (8, 4)  # the 32 points of the official box
    out = []
    for t, (x, y) in enumerate(traj_xy):
        hit = False
        for u in us:
            for v in vs:
                r = min(max(int(N - (y / CELL + u)), 0), N - 1)
                c = min(max(int(x / CELL + v), 0), N - 1)
                hit |= bool(seg[t, r, c])
        out.append(hit)
    return out


def _put(seg: np.ndarray, t: int, x_fwd: float, y_left: float) -> None:
    """Mark the official cell centred at suite point (x forward, y left) at step t."""
    big_x, big_y = -y_left, x_fwd
    seg[t, round(100 - 2 * big_y), round(100 + 2 * big_x)] = True


def _suite(seg: np.ndarray) -> torch.Tensor:
    """The official raster [K, row, col] as the suite's [K, H (x up), W (y up)]."""
    return torch.from_numpy(seg[:, ::-1, ::-1].copy())[None]


@pytest.fixture()
def case():
    seg = np.zeros((5, N, N), dtype=bool)
    _put(seg, 0, 1.0, 1.5)  # 1.5 m left: inside the official box's columns only
    _put(seg, 1, 1.0, -0.5)  # 0.5 m right: inside the cells box only
    _put(seg, 2, -1.5, 0.0)  # the ninth cell behind: the cells box covers 9 rows here, the official one 8
    _put(seg, 3, 2.5, 0.0)  # ahead, centred: both
    _put(seg, 4, 30.0, 30.0)  # far away: neither
    wps = torch.tensor(
        [
            [[0.02, 0.02]] * 5,  # standing still just off the cell corners (no ties)
            [[0.52, 0.02], [-2.98, 0.02], [-0.48, 3.02], [2.02, 0.52], [30.02, 29.02]],
        ],  # moving onto the agents
        dtype=torch.float64,
    )
    return seg, wps


def test_official_rule_gives_the_official_values(case):
    seg, wps = case
    got = ego_box_collisions(wps, _suite(seg).expand(2, -1, -1, -1), SUITE_EXTENT, rule="official")
    for b in range(2):
        lidar = torch.stack([-wps[b, :, 1], wps[b, :, 0]], -1).numpy()
        assert got[b].tolist() == [float(h) for h in official_hits(lidar, seg)]
    # by hand for the standing ego: its official box reads rows -1.0..2.5 m ahead, columns 0..1.5 m left
    assert got[0].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert got[1].tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_cells_rule_differs_where_the_docstring_says(case):
    seg, wps = case
    cells = ego_box_collisions(wps[:1], _suite(seg), SUITE_EXTENT)
    assert cells[0].tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]  # one cell further right and nine rows long here


def test_official_rule_in_stp3_collisions_drops_steps_where_the_driven_path_collides(case):
    seg, wps = case
    agents = _suite(seg)
    plan, gt = wps[:1], wps[:1].clone()
    gt[0, 3] = torch.tensor([-20.0, -20.0])  # the driven path is clear at step 3 only
    assert stp3_collisions(plan, gt, agents, SUITE_EXTENT, rule="official")[0].tolist() == [0.0, 0.0, 0.0, 1.0, 0.0]


def test_points_beyond_the_raster_read_its_edge_as_the_official_clip_does():
    seg = np.zeros((1, N, N), dtype=bool)
    seg[0, 0, 100] = True  # the front edge row, centre column
    wps = torch.tensor([[[60.0, 0.02]]], dtype=torch.float64)  # 10 m beyond the raster's front
    lidar = torch.stack([-wps[0, :, 1], wps[0, :, 0]], -1).numpy()
    assert official_hits(lidar, seg) == [True]
    assert ego_box_collisions(wps, _suite(seg), SUITE_EXTENT, rule="official").tolist() == [[1.0]]
    assert ego_box_collisions(wps, _suite(seg), SUITE_EXTENT).tolist() == [[0.0]]


def test_unknown_rule_is_one_line():
    with pytest.raises(ConfigError, match="collision rule 'box'"):
        ego_box_collisions(torch.zeros(1, 1, 2), torch.zeros(1, 1, 4, 4, dtype=torch.bool), SUITE_EXTENT, rule="box")


def test_each_point_reads_the_row_that_contains_it():
    seg = np.zeros((2, N, N), dtype=bool)
    _put(seg, 0, -1.0, 0.0)  # the box's last row: its rear point at -0.98 m lies in the cell centred at -1.0
    _put(seg, 1, 3.0, 0.0)  # beyond its front point at 2.52 m (the cell centred at 2.5)
    wps = torch.tensor([[[0.27, 0.02]] * 2], dtype=torch.float64)
    lidar = torch.stack([-wps[0, :, 1], wps[0, :, 0]], -1).numpy()
    assert official_hits(lidar, seg) == [True, False]
    assert ego_box_collisions(wps, _suite(seg), SUITE_EXTENT, rule="official").tolist() == [[1.0, 0.0]]
