"""ADDP system: conditional denoiser training for depth and referring masks, the discriminative baseline of the same
size, the three insights as switchable components, metrics with invalid-pixel masking and the bad inputs."""

from __future__ import annotations

import pytest
import torch
import torchmetrics

from core.errors import ConfigError
from datamodules.perception import PerceptionDataModule
from layers.diffusion import SmallUNet
from lightning_modules.addp import AddpLitModule
from lightning_modules.addp.metrics import DepthMetrics, MaskMetrics, mask_iou_per_image
from lightning_modules.addp.module import pick_negative

pytestmark = pytest.mark.usefixtures("one_thread")


def _module(task: str, **kw) -> AddpLitModule:
    torch.manual_seed(0)
    net = SmallUNet(in_channels=1, channels=8, emb_dim=16, cond_channels=3, cond_dim=64)
    opt = lambda p: torch.optim.Adam(p, lr=3e-3)  # noqa: E731
    return AddpLitModule(net, task=task, optimizer=opt, **{"T": 20, "n_steps": 4, "restart_step": 2, **kw})


def _batch(task: str, n: int = 8) -> dict[str, torch.Tensor]:
    dm = PerceptionDataModule(task=task, image_size=8, n_train=n, n_val=n, n_test=n, batch_size=n)
    dm.setup()
    return next(iter(dm.loader("train", shuffle=False)))


def _fit(m: AddpLitModule, batch, steps: int) -> list[float]:
    opt = m.configure_optimizers()
    losses = []
    for _ in range(steps):
        loss = m.training_step(batch, 0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("task", ["depth", "refseg"])
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"mode": "discriminative"},
        {"augment": "mix", "timestep_dist": "power", "timestep_use": "weight"},
        {"augment": "self", "timestep_dist": "contribution"},
    ],
)
def test_every_variant_trains_and_every_parameter_gets_a_gradient(task: str, kw: dict):
    m = _module(task, **kw)
    batch = _batch(task)
    loss = m.training_step(batch, 0)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in m.net.parameters() if p.requires_grad)
    x0, valid, c = m.encode(batch)
    pred, calls = m.predict(c)
    assert pred.shape == x0.shape and len(calls) == (1 if kw.get("mode") else 4)


def test_overfitting_one_batch_lowers_the_loss_and_baseline_has_the_same_size():
    m, batch = _module("depth", mode="discriminative"), _batch("depth")
    losses = _fit(m, batch, 15)
    assert losses[-1] < 0.5 * losses[0]
    assert sum(p.numel() for p in m.parameters()) == sum(p.numel() for p in _module("depth").parameters())


def test_curve_last_step_is_the_final_prediction_metric():
    m, batch = _module("refseg"), _batch("refseg")
    _fit(m, batch, 5)
    torch.manual_seed(1)
    curve = m.x0_quality_curve(batch)["iou"]
    torch.manual_seed(1)
    pred, _ = m.predict(m.encode(batch)[2])
    iou = torchmetrics.classification.BinaryJaccardIndex(zero_division=1.0)
    ref = iou(m.decode(pred).long().flatten(), (batch["target"] > 0.5).long().flatten())
    assert curve.shape == (5,) and float(curve[0]) == 0.0  # x0 = 0 is the all-background mask
    assert float(curve[-1]) == pytest.approx(float(ref), abs=1e-6)


def test_contribution_refresh_moves_mass_to_the_steps_that_gain():
    m = _module(
        "refseg", timestep_dist="contribution", contribution_ema=0.0, contribution_floor=0.0, contribution_smooth=0.0
    )
    m.refresh_p_t(torch.tensor([0.0, 0.6, 0.6, 0.6, 0.5], dtype=torch.float64))  # all gain at the first step
    # DDIM on T=20 with K=4 visits t = 20, 14, 7, 1; the first step stands for t = 17..20 (nearest, ties to it)
    assert m.steps.tolist() == [20, 14, 7, 1]
    assert float(m.p_t[16:].sum()) == pytest.approx(1.0) and float(m.p_t[:16].sum()) == 0.0


def test_pick_negative_names_the_wrong_object_covered_most():
    masks = torch.zeros(2, 3, 1, 4, 4, dtype=torch.bool)
    masks[:, 0, :, 0, :] = True  # target: row 0
    masks[:, 1, :, 1, :2] = True  # 2 px
    masks[:, 2, :, 2:, :] = True  # 8 px
    conds = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 3, 2)
    pred = torch.zeros(2, 1, 4, 4, dtype=torch.bool)
    pred[0, :, 1:3, :] = True  # covers 2 px of object 1 and 4 px of object 2
    neg = pick_negative(pred, masks, torch.ones(2, 3, dtype=torch.bool), conds)
    assert torch.equal(neg[0], conds[0, 2]) and torch.equal(neg[1], torch.zeros(2))  # item 1 covers nothing wrong


def test_bad_inputs():
    m = _module("depth")
    batch = _batch("depth")
    with pytest.raises(ConfigError, match=r"condition embedding has shape \(8, 32\).*\[B, 64\]"):
        m.training_step({**batch, "cond": torch.zeros(8, 32)}, 0)
    # invalid depth pixels (0 and NaN) are excluded from the loss and the metrics
    bad = batch["target"].clone()
    bad[:, :, :2] = 0.0
    bad[:, :, 2, :3] = float("nan")
    valid = batch["valid"] & (bad > 0)
    b2 = {**batch, "target": bad, "valid": valid}
    assert torch.isfinite(m.training_step(b2, 0))
    pred = torch.full_like(bad, 3.0)
    dm, ref = DepthMetrics("test"), torchmetrics.MeanAbsolutePercentageError()
    dm.update(pred, bad, b2["valid"])
    ok = b2["valid"] & torch.isfinite(bad)
    assert float(dm.absrel.compute()) == pytest.approx(float(ref(pred[ok], bad[ok])), rel=1e-6)
    # an empty mask target: empty prediction scores 1, a non-empty one 0; the loss stays finite
    empty = torch.zeros(2, 1, 4, 4, dtype=torch.bool)
    hit = empty.clone()
    hit[1, 0, 0, 0] = True
    assert mask_iou_per_image(hit, empty).tolist() == [1.0, 0.0]
    mm = MaskMetrics("test")
    mm.update(empty, empty)
    assert float(mm.iou.compute()) == 1.0
    r = _module("refseg")
    rb = _batch("refseg")
    assert torch.isfinite(r.training_step({**rb, "target": torch.zeros_like(rb["target"])}, 0))
    for kw in [{"task": "pose"}, {"augment": "morph"}, {"timestep_dist": "gauss"}, {"restart_step": 9}]:
        with pytest.raises(ConfigError):
            _module(kw.pop("task", "depth"), **kw)


def test_correction_rounds_have_a_restart_control_with_the_original_expression():
    """Rounds 2+ re-noise the previous mask and denoise again with a correction; the control (test/iou_restart{r})
    does the same restarts with the original expression and no negative, so that the correction's own effect can
    be separated from the resampling's."""
    m, batch = _module("refseg"), _batch("refseg")
    batch = {**batch, "refined": torch.randn_like(batch["cond"].float())}
    logged, calls = {}, []
    m.log = lambda k, v, **kw: logged.__setitem__(k, v)
    inner = m.predict

    def spy(c, **kw):
        calls.append((c["cond"].clone(), kw.get("neg"), kw.get("start", 0)))
        return inner(c, **kw)

    m.predict = spy
    m._evaluate(batch, "test")
    assert {f"test/iou_round{r}" for r in (1, 2, 3)} | {"test/iou_restart2", "test/iou_restart3"} <= set(logged)
    assert len(calls) == 1 + 2 + 2  # sample, two correction rounds, two control restarts
    (c1, n1, s1), (c2, n2, s2), (c3, _, _), (k2, kn2, ks2), (k3, kn3, _) = calls
    assert s1 == 0 and s2 == ks2 == m.hparams.restart_step
    assert torch.equal(c3, batch["refined"].float())  # round 3 uses the refined expression
    assert kn2 is None and kn3 is None  # the control never adds a negative ...
    assert torch.equal(k2, batch["cond"].float()) and torch.equal(k3, batch["cond"].float())  # ... or refines
    assert all(float(m.restart_metrics[i].iou.compute()) >= 0 for i in range(2))


def test_validation_draws_are_fixed_and_leave_the_training_stream_alone():
    """val/loss and the validation samples use seeded draws (core.rng.fixed_draws): the same value at every
    validation of the same weights, whatever the training stream's state, and the training stream continues as
    if no validation had run (a noisy validation curve cannot pass for a trend; runs are scored on the same noise)."""
    m, batch = _module("refseg"), _batch("refseg")
    logged: dict[str, list[float]] = {}
    m.log = lambda k, v, **kw: logged.setdefault(k, []).append(float(v) if torch.is_tensor(v) else v)
    torch.manual_seed(1)
    m.validation_step(batch, 0)
    after_val = torch.rand(3)
    torch.manual_seed(1)
    assert torch.equal(torch.rand(3), after_val)  # the training stream did not move
    torch.manual_seed(2)  # another state of the training stream: the same draws
    m.validation_step(batch, 0)
    assert logged["val/loss"][0] == logged["val/loss"][1]
    m.validation_step(batch, 1)  # another batch index draws differently
    assert logged["val/loss"][2] != logged["val/loss"][0]
