"""The per-step x0 quality curve works on any suite diffusion module: on the suite's DiffusionLitModule (EDM, vector
data) the last DDIM call's x0-prediction is the sample itself, and the callback averages and checks its contract."""

from __future__ import annotations

import pytest
import torch

from callbacks.x0_quality import X0QualityCurve
from core.errors import ConfigError
from layers.diffusion import MLPDenoiser
from lightning_modules._shared.diffusion import DiffusionLitModule

pytestmark = pytest.mark.usefixtures("one_thread")


def test_curve_on_the_suite_diffusion_module_ends_at_the_sample():
    torch.manual_seed(0)
    m = DiffusionLitModule(net=MLPDenoiser(dim=2, hidden=16, depth=1, emb_dim=8), n_steps=6, ref_steps=0)
    batch = torch.randn(32, 2)
    curve = m.x0_quality_curve(batch)["mse_to_final"]
    assert curve.shape == (7,) and float(curve[-1]) == pytest.approx(0.0, abs=1e-12)
    assert float(curve[0]) > 0  # x0 = 0 is not the sample


def test_callback_averages_batches_and_names_a_missing_hook():
    cb = X0QualityCurve(n_batches=2, plot=False)

    class Fake:
        def x0_quality_curve(self, batch):
            return {"iou": torch.tensor([0.0, batch, 2 * batch], dtype=torch.float64)}

    for i, b in enumerate([1.0, 3.0, 100.0]):
        cb.on_test_batch_end(None, Fake(), None, b, i)
    assert cb.curves() == {"iou": [0.0, 2.0, 4.0]}  # the third batch is beyond n_batches
    with pytest.raises(ConfigError, match="x0_quality_curve"):
        cb.on_test_epoch_start(None, object())
    with pytest.raises(ConfigError):
        X0QualityCurve(n_batches=0)
