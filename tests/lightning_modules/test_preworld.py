"""PreWorld: network shapes and gradients, forecasting recursion and its flags, the two stages, curriculum, ray
sampling weights, metrics, and stage 2 reading stage 1's checkpoint."""

from __future__ import annotations

import math

import pytest
import torch

from core.errors import CheckpointError, ConfigError
from datamodules.nuscenes import NuScenesDataModule
from layers.occupancy.preworld import Forecaster, LiftSplat, forecast
from lightning_modules.preworld import LossWeights, PreWorldLitModule
from lightning_modules.preworld.metrics import collisions, iou_from_confusion
from ops.occupancy.schedule import horizon_schedule, ray_sampling_weights

PC = (-8.0, -8.0, -1.0, 8.0, 8.0, 3.0)


@pytest.fixture(scope="module")
def batch():
    torch.set_num_threads(1)
    dm = NuScenesDataModule(n_scenes=3, frames_per_scene=2, horizon=2, batch_size=2)
    dm.setup("fit")
    return next(iter(torch.utils.data.DataLoader(dm.datasets["train"], batch_size=2)))


def _model(**kw) -> PreWorldLitModule:
    torch.manual_seed(0)
    args = dict(horizon=2, channels=8, context=8, depth_bins=8, encoder_width=8, n_rays=64, n_inner=16)
    args.update(kw)
    return PreWorldLitModule(**args)


def test_horizon_schedule_is_the_official_curriculum():
    assert [horizon_schedule(e, "pretrain") for e in range(1, 10)] == [2, 2, 2, 3, 4, 5, 6, 6, 6]
    assert [horizon_schedule(e, "finetune") for e in range(1, 13)] == [2, 2, 2, 2, 2, 2, 3, 3, 4, 4, 5, 5]
    assert horizon_schedule(9, "pretrain", max_horizon=3) == 3
    with pytest.raises(ValueError):
        horizon_schedule(1, "other")


def test_ray_sampling_weights():
    cls = torch.tensor([0, 0, 0, 1, 3, 3, 255])
    frame = torch.tensor([0, 0, 0, 0, 0, 1, 1])
    w = ray_sampling_weights(cls, frame, dynamic=(3,), w_adj=0.3, w_dyn=0.0)
    assert math.isclose(float(w[0]), 1.0) and math.isclose(float(w[3]), math.exp(0.005 * 2))
    assert math.isclose(float(w[4]), math.exp(0.005 * 0.5)) and float(w[5]) == 0.0  # dynamic ray of an adjacent frame
    assert math.isclose(float(w[6]), 0.3)  # unlabelled adjacent ray: weight 1 x 0.3


def test_lift_splat_puts_features_where_the_camera_looks():
    torch.manual_seed(0)
    lift = LiftSplat((16, 16, 4), PC, depth_bins=8, context=4, channels=4, width=8)
    from datamodules.driving_world import camera_rig

    k, c = camera_rig(1, 16, 32)  # one front camera
    img = torch.rand(1, 1, 3, 16, 32)
    pts = lift.frustum(k[None], c[None], 8, 16, 2)
    assert (pts[..., 0] > 0).all()  # a front camera's frustum lies ahead of the ego
    v = lift(img, k[None], c[None])
    assert v.shape == (1, 4, 16, 16, 4) and torch.isfinite(v).all()


def test_forecaster_recursion_flags():
    torch.manual_seed(0)
    f = Forecaster(8)
    v, s = torch.randn(2, 8, 8, 8, 2), torch.randn(2, 21)
    vols, off = forecast(v, s, f, 3)
    assert len(vols) == 3 and off.shape == (2, 3, 2)
    vols2, off2 = forecast(v, s, f, 3, roll_state=False)
    assert torch.allclose(off[:, 0], off2[:, 0]) and not torch.allclose(off[:, 1], off2[:, 1])
    _, off3 = forecast(v, s, f, 1, ego_conditioning=False)
    _, off4 = forecast(v, torch.zeros_like(s), f, 1)
    assert torch.allclose(off3, off4)


@pytest.mark.parametrize("stage", ["pretrain", "finetune"])
def test_every_parameter_used_by_its_stage_gets_a_gradient(stage, batch):
    m = _model(stage=stage, curriculum=False)
    parts = m.losses(batch, 2)
    assert torch.isfinite(parts["loss"]) and parts["loss"] > 0
    parts["loss"].backward()
    unused = ("occ_head",) if stage == "pretrain" else ("attrs",)
    for name, p in m.named_parameters():
        if not name.startswith(unused):
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    keys = {"depth", "sem", "rgb", "entropy", "distortion"} if stage == "pretrain" else {"focal", "lovasz"}
    assert keys <= set(parts) and "traj" in parts


def test_official_depth_mode_changes_the_rendered_depth(batch):
    m1, m2 = _model(), _model(depth_mode="official")
    v = torch.randn(2, 8, 16, 16, 4)
    rays = m1._draw_rays(batch, 0)
    d1, d2 = m1.render_loss(v, rays)["depth"], m2.render_loss(v, rays)["depth"]
    assert not torch.isclose(d1, d2)


def test_a_few_steps_lower_the_finetune_loss(batch):
    m = _model(stage="finetune", curriculum=False)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    first = None
    for _ in range(15):
        loss = m.losses(batch, 1)["loss"]
        first = float(loss.detach()) if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(m.losses(batch, 1)["loss"]) < 0.8 * first


def test_init_from_reads_stage_one_weights(tmp_path):
    pre = _model()
    with torch.no_grad():
        pre.lift.final_conv[0].weight.add_(1.0)  # stage 1 "trained" weights differ from a fresh init
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": pre.state_dict()}, path)
    fine = _model(stage="finetune", init_from=str(path))
    assert not torch.equal(fine.lift.final_conv[0].weight, pre.lift.final_conv[0].weight)
    fine._load_init(str(path))
    assert torch.equal(fine.lift.final_conv[0].weight, pre.lift.final_conv[0].weight)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        fine._load_init(str(tmp_path / "none.ckpt"))
    (tmp_path / "bad.ckpt").write_bytes(b"\x00garbage")
    with pytest.raises(CheckpointError, match="cannot read"):
        fine._load_init(str(tmp_path / "bad.ckpt"))
    with pytest.raises(ConfigError, match="model.stage"):
        _model(stage="both")


def test_iou_and_collision_metrics():
    cm = torch.tensor([[3.0, 1.0, 0.0], [0.0, 2.0, 1.0], [1.0, 0.0, 5.0]])  # cm[target, pred], class 2 = free
    r = iou_from_confusion(cm)
    assert math.isclose(float(r["miou"]), (3 / 5 + 2 / 4) / 2, rel_tol=1e-6)
    assert math.isclose(float(r["iou"]), 6 / (13 - 5), rel_tol=1e-6)
    obst = torch.zeros(1, 2, 16, 16, dtype=torch.bool)
    obst[0, 1, 9, 8] = True
    wps = torch.tensor([[[1.5, 0.5], [1.5, 0.5]]])
    assert collisions(wps, obst, PC).tolist() == [[0.0, 1.0]]
    assert collisions(torch.full((1, 2, 2), 50.0), obst, PC).sum() == 0  # off the grid: no collision


def test_pretrain_only_prediction_thresholds_density_and_eval_logs_baselines(batch):
    m = _model()
    v = torch.zeros(1, 8, 16, 16, 4)
    with torch.no_grad():
        m.attrs.density[-2].bias.fill_(-100.0)  # density ~ 0 everywhere -> all free
    assert (m.predict_occ(v) == 4).all()
    with torch.no_grad():
        m.attrs.density[-2].bias.fill_(100.0)  # density >> 8.5 -> occupied, class from the semantic head
    assert (m.predict_occ(v) < 4).all()
    m._eval(batch, "val")
    assert m.metrics["val_occ_0"].cm.update_called and m.metrics["val_copy_2"].cm.update_called
    assert float(m.metrics["val_l2_cv_1"].compute()) >= 0
    shifted = _model(official_label_offset=True)
    shifted._eval(batch, "val")  # step k scored against frame k + 1: the last step has no target
    assert shifted.metrics["val_occ_1"].cm.update_called and not shifted.metrics["val_occ_2"].cm.update_called


@pytest.mark.parametrize("stage", ["pretrain", "finetune"])
def test_the_loss_is_the_sum_of_its_terms_by_their_weights(stage, batch):
    weights = {"depth": 2.0, "entropy": 0.5, "traj": 3.0, "focal": 0.25, "lovasz": 4.0}
    m = _model(stage=stage, curriculum=False, loss=weights)
    assert m.loss_weights == LossWeights(**weights) and m.loss_weights.sem == 1.0  # terms left out keep the paper's
    assert m.hparams["loss"]["depth"] == 2.0  # plain data in the checkpoint
    parts = m.losses(batch, 2)
    terms = [k for k in parts if k != "loss"]
    assert "traj" in terms and len(terms) >= 4
    expected = sum(getattr(m.loss_weights, k) * parts[k] for k in terms)
    assert torch.isclose(parts["loss"].detach(), expected, rtol=1e-5)
    with pytest.raises(ConfigError, match=r"model.loss.w_rgb: no such loss term"):
        _model(loss={"w_rgb": 1.0})


def test_one_forward_pass_feeds_the_evaluation_loss_and_metrics(batch):
    m = _model()
    calls = []
    m.lift.register_forward_hook(lambda *_: calls.append(1))
    m._eval(batch, "val")
    assert len(calls) == 1
    assert m.metrics["val_occ_0"].cm.update_called
