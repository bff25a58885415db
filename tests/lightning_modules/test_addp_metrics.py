"""ADDP's depth metrics by the standard NYUv2 protocol: metric depth, the Eigen crop, the 10 m cap
and per-image means, on a synthetic 480 x 640 fixture with hand-computed AbsRel / RMSE / delta1; selected by
``model.depth_protocol``."""

from __future__ import annotations

import math

import pytest
import torch

from core.errors import ConfigError
from datamodules.perception import PerceptionDataModule
from layers.diffusion import SmallUNet
from lightning_modules.addp import AddpLitModule
from lightning_modules.addp.metrics import DepthMetrics, eigen_crop_mask, nyu_eigen_errors


def test_eigen_crop_is_rows_45_471_cols_41_601_of_the_nyu_frame():
    m = eigen_crop_mask(480, 640)
    ref = torch.zeros(480, 640, dtype=torch.bool)
    ref[45:471, 41:601] = True
    assert torch.equal(m, ref)
    # at 48 x 64 the same fractions: rows 4.5..47.1 -> 5:47, cols 4.1..60.1 -> 4:60
    small = torch.zeros(48, 64, dtype=torch.bool)
    small[5:47, 4:60] = True
    assert torch.equal(eigen_crop_mask(48, 64), small)


def _fixture() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three 480 x 640 images (valid = ground truth > 0, as the NYUv2 loader marks it).

    1. ground truth 2 m; prediction 2.4 m on crop columns 41:321 and 3 m on 321:601, 100 m outside the crop (which
       must not count); a 100 x 100 block of 12 m ground truth (beyond the cap) in the left half and one of 0 (no
       ground truth) in the right half, so both halves keep 426 x 280 - 10^4 valid pixels. Per image: AbsRel
       (0.2 + 0.5) / 2 = 0.35, RMSE sqrt((0.4^2 + 1^2) / 2) = sqrt(0.58), delta1 1/2 (2.4/2 = 1.2 < 1.25, 3/2 not).
    2. ground truth 9 m, prediction 12 m, clipped to the 10 m cap: AbsRel 1/9, RMSE 1, delta1 1 (10/9 < 1.25;
       unclipped it would be 1/3, 3, 0).
    3. no ground truth at all: contributes nothing.
    """
    gt = torch.zeros(3, 1, 480, 640)
    pred = torch.full_like(gt, 100.0)
    gt[0] = 2.0
    pred[0, :, 45:471, 41:321], pred[0, :, 45:471, 321:601] = 2.4, 3.0
    gt[0, :, 100:200, 100:200], gt[0, :, 300:400, 400:500] = 12.0, 0.0
    gt[1], pred[1] = 9.0, 12.0
    return pred, gt, gt > 0


def test_nyu_eigen_protocol_matches_hand_computed_values():
    pred, gt, valid = _fixture()
    m = DepthMetrics("test", protocol="nyu_eigen")
    m.update(pred[:2], gt[:2], valid[:2])  # two updates: the means are over images, not batches
    m.update(pred[2:], gt[2:], valid[2:])
    got = {k.split("/")[1]: float(v.compute()) for k, v in m.items().items()}
    assert got["absrel"] == pytest.approx((0.35 + 1 / 9) / 2, rel=1e-6)
    assert got["rmse"] == pytest.approx((math.sqrt(0.58) + 1.0) / 2, rel=1e-6)
    assert got["delta1"] == pytest.approx(0.75, rel=1e-6)
    # the suite's pooled convention on the same maps: no crop, no cap, pixel-pooled -> a different (worse) number
    pooled = DepthMetrics("test")
    pooled.update(pred, gt, valid)
    assert float(pooled.absrel.compute()) > 5 * got["absrel"]


def test_module_selects_the_protocol_by_config():
    net = SmallUNet(in_channels=1, channels=8, emb_dim=16, cond_channels=3, cond_dim=64)
    m = AddpLitModule(net, depth_protocol="nyu_eigen", T=20, n_steps=4, restart_step=2)
    assert m.metrics["val"].protocol == m.metrics["test"].protocol == "nyu_eigen"
    assert AddpLitModule(net, T=20, n_steps=4, restart_step=2).metrics["test"].protocol == "pooled"
    with pytest.raises(ConfigError, match="model.depth_protocol='eigen'"):
        AddpLitModule(net, depth_protocol="eigen", T=20, n_steps=4, restart_step=2)


def test_x0_curve_follows_the_protocol():
    """Under ``nyu_eigen`` the per-step x0 curve's last point is the protocol's AbsRel of the final prediction."""
    torch.manual_seed(0)
    net = SmallUNet(in_channels=1, channels=8, emb_dim=16, cond_channels=3, cond_dim=64)
    m = AddpLitModule(net, depth_protocol="nyu_eigen", T=20, n_steps=4, restart_step=2)
    dm = PerceptionDataModule(task="depth", image_size=8, n_train=4, n_val=4, n_test=4, batch_size=4)
    dm.setup()
    batch = next(iter(dm.loader("val", shuffle=False)))
    torch.manual_seed(1)
    curve = m.x0_quality_curve(batch)["absrel"]
    torch.manual_seed(1)
    pred, _ = m.predict(m.encode(batch)[2])
    ref = nyu_eigen_errors(m.decode(pred), batch["target"], batch["valid"])["absrel"].mean()
    assert curve.shape == (5,) and float(curve[-1]) == pytest.approx(float(ref), rel=1e-9)
