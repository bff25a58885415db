"""ADDP learns the embedded task: a tiny diffusion model trained for a few seconds on the rendered
scenes scores a clearly better held-out metric, through the module's own validation path (sampling, decoding,
torchmetrics), than the same model untrained. A loss with a flipped target, a decode on the wrong axis or an update
that does nothing fails it; the op-level tests of ``test_addp.py`` do not."""

from __future__ import annotations

import pytest
import torch

from datamodules.perception import PerceptionDataModule
from layers.diffusion import SmallUNet
from lightning_modules.addp import AddpLitModule

pytestmark = pytest.mark.usefixtures("one_thread")


def _val_metrics(m: AddpLitModule, batch: dict) -> dict[str, float]:
    """The module's validation on one held-out batch (fixed draws), metrics read back and reset."""
    m.log = lambda *a, **kw: None
    m.eval()
    with torch.no_grad():
        m.validation_step(batch, 0)
    m.train()
    out = {k.split("/")[1]: float(v.compute()) for k, v in m.metrics["val"].items().items()}
    for v in m.metrics["val"].items().values():
        v.reset()
    return out


# depth: 8x8 scenes, 48 steps (~0.5 s of CPU; AbsRel 0.50 -> 0.20); masks: 16x16 scenes, 320 steps (~7 s; IoU
# 0.05 -> 0.28; the untrained model's masks and the first ~50 steps' near-empty ones both score about 0.05)
@pytest.mark.parametrize(("task", "size", "epochs"), [("depth", 8, 6), ("refseg", 16, 40)])
def test_training_on_the_embedded_task_beats_the_untrained_model(task, size, epochs):
    dm = PerceptionDataModule(
        task=task, image_size=size, n_train=256, n_val=64, n_test=8, batch_size=32, partial_prob=0.0
    )  # full (unambiguous) expressions: learnable in a few hundred steps
    dm.setup()
    val = next(iter(dm.loader("val", shuffle=False)))
    torch.manual_seed(0)
    net = SmallUNet(in_channels=1, channels=8, emb_dim=16, cond_channels=3, cond_dim=64)
    m = AddpLitModule(net, task=task, T=20, n_steps=4, restart_step=2, optimizer=lambda p: torch.optim.Adam(p, lr=3e-3))
    before = _val_metrics(m, val)
    opt = m.configure_optimizers()
    m.log = lambda *a, **kw: None
    for _ in range(epochs):  # x 8 batches
        for batch in dm.loader("train", shuffle=True):
            loss = m.training_step(batch, 0)
            opt.zero_grad()
            loss.backward()
            opt.step()
    after = _val_metrics(m, val)
    if task == "depth":
        assert after["absrel"] < 0.6 * before["absrel"] and after["delta1"] > before["delta1"] + 0.2, (before, after)
    else:
        assert after["iou"] > before["iou"] + 0.15 and after["miou"] > before["miou"] + 0.15, (before, after)
