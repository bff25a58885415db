"""PreWorld module: the rendering and loss conventions as the module applies them: default
rendered depth on a known synthetic scene, the official 3D-loss forms by config, the trajectory loss summed over
steps and the pre-train-only label offset."""

from __future__ import annotations

import math

import pytest
import torch

from datamodules.nuscenes import NuScenesDataModule
from lightning_modules.preworld import PreWorldLitModule
from ops.occupancy import losses as L

PC = (-8.0, -8.0, -1.0, 8.0, 8.0, 3.0)
SMALL = dict(channels=8, context=8, depth_bins=8, encoder_width=8, n_rays=64, n_inner=16)


@pytest.fixture(scope="module")
def batch():
    torch.set_num_threads(1)
    dm = NuScenesDataModule(n_scenes=3, frames_per_scene=2, horizon=2, batch_size=2)
    dm.setup("fit")
    return next(iter(torch.utils.data.DataLoader(dm.datasets["train"], batch_size=2)))


def _model(**kw) -> PreWorldLitModule:
    torch.manual_seed(0)
    args = dict(horizon=2, **SMALL)
    args.update(kw)
    return PreWorldLitModule(**args)


class _Fixed(torch.nn.Module):
    """Stands in for the attribute heads: returns a fixed raw attribute volume whatever the voxel features."""

    def __init__(self, vol: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("vol", vol)

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return self.vol


def test_module_default_renders_the_true_depth_of_a_synthetic_scene():
    """The rendered depth through the module's own hyper-parameters: radius 7.8 and centre z 1 of conf/model,
    background length from pc_range, bin midpoints, metric depth through the contracted distance."""
    grid = (128, 128, 16)
    x, y, z = (torch.linspace(PC[k], PC[3 + k], grid[k] + 1)[:-1] + (PC[3 + k] - PC[k]) / grid[k] / 2 for k in range(3))
    gx, gy, gz = torch.meshgrid(x, y, z, indexing="ij")
    occ = (gz < 0) | ((gx > 3) & (gx < 4) & (gy.abs() < 1) & (gz < 2)) | (gx < -7.875)
    vol = torch.zeros(1, 1 + 4 + 3, *grid)
    vol[0, 0] = torch.where(occ, 200.0, -200.0)
    yaw = torch.tensor([0.0, 10.0, 180.0, 184.0]).deg2rad()
    d = torch.stack([yaw.cos(), yaw.sin(), torch.zeros(4)], -1)
    d = torch.cat([d, torch.tensor([[0.0, math.cos(math.radians(30)), -0.5]])])[None]  # pitched 30 deg down
    true = torch.tensor([[3.0, 3.0 / math.cos(math.radians(10)), 7.875, 7.875 / math.cos(math.radians(4)), 2.0]])
    rays = {"rays_o": torch.tensor([0.0, 0.0, 1.0]).expand(1, 5, 3), "rays_d": d}
    m = PreWorldLitModule(grid=grid, pc_range=PC, horizon=1, **{**SMALL, "n_inner": 256})
    m.attrs = _Fixed(vol)
    err = (m.render(torch.zeros(1), rays)["depth"] - true).abs()
    assert float(err.max()) < 0.1, err
    official = PreWorldLitModule(grid=grid, pc_range=PC, horizon=1, depth_mode="official", **{**SMALL, "n_inner": 256})
    official.attrs = _Fixed(vol)  # the official s = t / (1 + t) depth compresses every distance
    assert float((official.render(torch.zeros(1), rays)["depth"] - true).abs().mean()) > 1.0


def _occ_case(num_classes: int = 5):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, num_classes, 16, 16, 4, generator=g)
    occ = torch.randint(0, num_classes, (2, 16, 16, 4), generator=g)
    mask = torch.rand(2, 16, 16, 4, generator=g) > 0.5
    return logits, occ, mask


def test_3d_losses_unmasked_by_config():
    """The official trains the 3D losses without the camera mask (camera_mask=None)."""
    logits, occ, mask = _occ_case()
    noise = torch.randn(logits.shape, generator=torch.Generator().manual_seed(1)) * 3
    moved = logits + noise * (~mask)[:, None]  # change only camera-invisible voxels
    masked, unmasked = _model(stage="finetune"), _model(stage="finetune", loss_camera_mask=False)
    a, b = masked.occ_loss(logits, occ, mask), masked.occ_loss(moved, occ, mask)
    assert all(math.isclose(float(a[k]), float(b[k]), rel_tol=1e-6) for k in a)
    a, b = unmasked.occ_loss(logits, occ, mask), unmasked.occ_loss(moved, occ, mask)
    assert all(not math.isclose(float(a[k]), float(b[k]), rel_tol=1e-6) for k in a)


def test_official_focal_and_lovasz_forms_by_config():
    """focal_form=sigmoid is the official CustomFocalLoss (x100, class weights with free 0, radial weight);
    lovasz_drop_free=true drops free voxels from the Lovasz term (official ignore=17)."""
    logits, occ, mask = _occ_case()
    m = _model(stage="finetune", loss_camera_mask=False, focal_form="sigmoid", lovasz_drop_free=True)
    with torch.no_grad():
        m.class_w.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))
    parts = m.occ_loss(logits, occ, mask)
    z, y = logits.permute(0, 2, 3, 4, 1).reshape(-1, 5), occ.reshape(-1)
    radial = L.radial_weight(16, 16)[None, :, :, None].expand(2, 16, 16, 4).reshape(-1)
    ref = L.sigmoid_focal(z, y, torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0]), voxel_weight=radial)
    assert math.isclose(float(parts["focal"]), float(ref), rel_tol=1e-6) and float(ref) > 1.0
    assert math.isclose(float(parts["lovasz"]), float(L.lovasz_softmax(z, y, drop_class=4)), rel_tol=1e-6)
    d = _model(stage="finetune", loss_camera_mask=False).occ_loss(logits, occ, mask)  # the suite's default forms
    assert not math.isclose(float(d["focal"]), float(parts["focal"]), rel_tol=1e-3)
    assert not math.isclose(float(d["lovasz"]), float(parts["lovasz"]), rel_tol=1e-3)
    with pytest.raises(Exception, match="focal_form"):
        _model(focal_form="hinge")


def test_trajectory_term_is_summed_over_steps(batch):
    """Sum over forecast steps of the per-step loss (the official logs one loss_traj_{k}s per step and
    mmdet sums them), not their mean."""
    m = _model(stage="finetune", curriculum=False)
    m.eval()  # BatchNorm on running statistics: the two forward passes below see the same volumes
    with torch.no_grad():
        _, off = m.volumes(batch, 2)
        traj = m.losses(batch, 2)["traj"]
    gt = batch["waypoints"][:, :2]
    gt_off = torch.cat([gt[:, :1], gt[:, 1:] - gt[:, :-1]], 1)
    per_step = [(off[:, k] - gt_off[:, k]).pow(2).mean(0).sum() for k in range(2)]
    assert math.isclose(float(traj), float(sum(per_step)), rel_tol=1e-5)


def test_official_label_offset_applies_to_the_pretrain_only_branch(batch):
    """The official +2 labels exist only in simple_test's non-fine-tuned branch (density threshold); the
    fine-tuned branch labels step k as k. The flag therefore shifts pre-train-only evaluation only."""
    pre = _model(official_label_offset=True)
    pre._eval(batch, "val")  # k scored against frame k + 1: the last step (k = 2) has no target
    assert pre.metrics["val_occ_1"].cm.update_called and not pre.metrics["val_occ_2"].cm.update_called
    fine = _model(stage="finetune", official_label_offset=True)
    fine._eval(batch, "val")
    assert fine.metrics["val_occ_2"].cm.update_called
