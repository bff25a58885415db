"""PreWorld conventions pinned against the official code: rendered depth of a known synthetic
scene, bin-midpoint samples and the official background length, the official 3D-loss forms (sigmoid focal, Lovasz
without free voxels, unmasked), the trajectory loss summed over steps and the pre-train-only label offset."""

from __future__ import annotations

import math

import pytest
import torch

from ops.occupancy import losses as L
from ops.occupancy import naive as N
from ops.occupancy import render as R

PC = (-8.0, -8.0, -1.0, 8.0, 8.0, 3.0)  # the embedded world's extent; radius 7.8 and centre z 1 as in conf/model
GRID = (128, 128, 16)  # 0.125 m x 0.125 m x 0.25 m voxels: fine enough for a wall inside the contracted shell
CENTER, RADIUS = (0.0, 0.0, 1.0), 7.8


def _scene() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """An opaque synthetic scene [1, 1 + 2 + 3, X, Y, Z] (raw density +-200, 2 semantic logits, RGB) and rays from
    the scene centre with their analytic true depths:

    * ground z < 0: rays pitched down by phi towards +y hit it at 1 / sin(phi);
    * a box x in [3, 4], |y| <= 1, z in [0, 2]: horizontal rays at yaw theta hit it at 3 / cos(theta);
    * a wall x <= -7.875 (the grid's last voxel column), which lies in the contracted shell between the ball of
      radius 7.8 and the grid's half-extent 8: horizontal rays at yaw 180 +- a hit it at 7.875 / cos(a).
    """
    x, y, z = (torch.linspace(PC[k], PC[3 + k], GRID[k] + 1)[:-1] + (PC[3 + k] - PC[k]) / GRID[k] / 2 for k in range(3))
    gx, gy, gz = torch.meshgrid(x, y, z, indexing="ij")
    occ = (gz < 0) | ((gx > 3) & (gx < 4) & (gy.abs() < 1) & (gz < 2)) | (gx < -7.875)
    vol = torch.zeros(1, 6, *GRID)
    vol[0, 0] = torch.where(occ, 200.0, -200.0)
    vol[0, 1] = occ.double()
    dirs, depth = [], []
    for phi in (20.0, 30.0, 45.0, 60.0):
        p = math.radians(phi)
        dirs.append((0.0, math.cos(p), -math.sin(p)))
        depth.append(1.0 / math.sin(p))
    for th in (-15.0, 0.0, 10.0):
        a = math.radians(th)
        dirs.append((math.cos(a), math.sin(a), 0.0))
        depth.append(3.0 / math.cos(a))
    for th in (175.0, 180.0, 184.0):
        a = math.radians(th)
        dirs.append((math.cos(a), math.sin(a), 0.0))
        depth.append(7.875 / abs(math.cos(a)))
    d = torch.tensor(dirs)[None]
    o = torch.tensor(CENTER).expand_as(d).clone()
    return vol, o, d, torch.tensor(depth)[None]


@pytest.fixture(autouse=True)
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def test_default_rendered_depth_is_the_true_depth_of_a_synthetic_scene():
    """With the defaults (metric depth through the contracted distance, bin midpoints, background length
    (half-extent - radius) / radius) every ray renders its true depth, the wall in the contracted shell included;
    the official s = t / (1 + t) convention compresses every depth."""
    vol, o, d, true = _scene()
    out = R.render_rays(vol, o, d, PC, CENTER, RADIUS, n_inner=256)
    assert float(out["t_last"].max()) < 1e-3  # opaque: every ray terminates
    err = (out["depth"] - true).abs()
    assert float(err.max()) < 0.1, err
    # the official convention on the same scene and weights compresses every depth
    official = R.render_rays(vol, o, d, PC, CENTER, RADIUS, n_inner=256, depth_mode="official")["depth"]
    assert float((official - true).abs().mean()) > 1.0


def test_background_length_and_bin_midpoints_are_the_official_ones():
    """bg_len = (half-extent - radius) / radius (1/39 for radius 39 of a 40 m grid) and sample distances at
    the midpoints of the bins linspace(0, 2, n_inner + 1) and 2 / linspace(1, 1/64, n_outer + 1)."""
    assert math.isclose(R.background_length((-40.0, -40.0, -1.0, 40.0, 40.0, 5.4), 39.0), 1 / 39)
    assert math.isclose(R.background_length(PC, RADIUS), 0.2 / 7.8)
    t = R.ray_distances(30)
    inner = torch.linspace(0, 2, 31)
    outer = 2 / torch.linspace(1, 1 / 64, 3)
    assert torch.allclose(t, torch.cat([(inner[1:] + inner[:-1]) / 2, (outer[1:] + outer[:-1]) / 2]))
    lo, hi = R.ray_bins(30)
    assert torch.allclose((lo + hi) / 2, t) and torch.equal(lo[1:], hi[:-1]) and lo[0] == 0 and hi[-1] == 128


def test_sample_depths_match_their_loop_twin():
    g = torch.Generator().manual_seed(0)
    o = torch.randn(5, 3, generator=g) * 0.5 + torch.tensor(CENTER)
    d = torch.nn.functional.normalize(torch.randn(5, 3, generator=g), dim=-1)
    t = R.ray_distances(12)
    c = torch.tensor(CENTER)
    pts = R.sample_ray_points(o, d, t, c, RADIUS, 0.1)
    for mode in R.DEPTH_MODES:
        fast = R.sample_depths(t, pts, o, RADIUS, mode)
        assert torch.allclose(fast, N.naive_sample_depths(t, pts, o, RADIUS, mode), atol=1e-12), mode
    inside = (pts - c).norm(dim=-1) < RADIUS - 1e-9  # inside the ball the contracted distance is the metric one
    con, ball = R.sample_depths(t, pts, o, RADIUS, "contracted"), (RADIUS * t)[None, :].expand_as(pts[..., 0])
    assert torch.allclose(con[inside], ball[inside], atol=1e-9) and (con <= ball + 1e-9).all()
    with pytest.raises(ValueError, match="depth_mode"):
        R.sample_depths(t, pts, o, RADIUS, "metric")


def test_sigmoid_focal_matches_its_loop_twin_with_grads():
    """The official focal loss is a sigmoid focal loss over one-hot channels (alpha 0.25, gamma 2), weighted
    per channel by the class weight (free 0) and per voxel by the radial weight, summed over channels, averaged over
    voxels, x100."""
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(24, 4, generator=g), torch.randint(0, 4, (24,), generator=g)
    y[5] = 255
    wc = torch.tensor([1.5, 0.7, 2.0, 0.0])
    rw = 1 + torch.rand(24, generator=g)
    z = logits.clone().requires_grad_(True)
    a = L.sigmoid_focal(z, y, wc, voxel_weight=rw)
    a.backward()
    z2 = logits.clone().requires_grad_(True)
    b = N.naive_sigmoid_focal(z2, y, wc, rw)
    b.backward()
    assert torch.allclose(a, b, atol=1e-12) and torch.allclose(z.grad, z2.grad, atol=1e-12)
    assert float(z.grad[:, 3].abs().max()) == 0.0  # free channel weight 0: its logit is never trained by the focal
    assert float(z.grad[5].abs().max()) == 0.0  # ignored voxel
    assert math.isclose(float(L.sigmoid_focal(logits, y, wc, voxel_weight=rw, scale=1.0)) * 100, float(a))


def test_radial_weight_is_one_at_the_centre_and_two_at_the_corner():
    w = L.radial_weight(8, 6)
    assert w.shape == (8, 6) and math.isclose(float(w[4, 3]), 1.0) and math.isclose(float(w.max()), 2.0)
    assert math.isclose(float(w[0, 0]), 2.0)


def test_lovasz_can_drop_the_free_class():
    """The official Lovasz term ignores free voxels (ignore=17): changing the logits of free voxels leaves
    it unchanged, while the suite's default form sees them."""
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(30, 4, generator=g), torch.randint(0, 4, (30,), generator=g)
    moved = logits.clone()
    moved[y == 3] += torch.randn(int((y == 3).sum()), 4, generator=g) * 3
    assert math.isclose(
        float(L.lovasz_softmax(logits, y, drop_class=3)), float(L.lovasz_softmax(moved, y, drop_class=3))
    )
    assert not math.isclose(float(L.lovasz_softmax(logits, y)), float(L.lovasz_softmax(moved, y)))
    keep = y != 3
    ref = L.lovasz_softmax(logits[keep], y[keep])  # probabilities still over all 4 classes, class 3 never present
    assert math.isclose(float(L.lovasz_softmax(logits, y, drop_class=3)), float(ref))


def test_trajectory_loss_sums_over_steps():
    """The official loss is one term per forecast step (loss_traj_{k}s), summed: sum_k sum_xy mean_b."""
    g = torch.Generator().manual_seed(0)
    pred, gt = torch.randn(4, 3, 2, generator=g), torch.randn(4, 3, 2, generator=g)
    per_step = [(pred[:, k] - gt[:, k]).pow(2).mean(0).sum() for k in range(3)]
    assert math.isclose(float(L.trajectory_loss(pred, gt)), float(sum(per_step)), rel_tol=1e-12)
