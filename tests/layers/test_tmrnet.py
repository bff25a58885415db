"""TMRNet and the burst baselines: shapes, the alpha / beta = 0 starts, gradients, DCN fast path, bad input."""

from __future__ import annotations

import pytest
import torch

from layers.vision.burst_baselines import EarlyFusionNet, FrameAverage, SingleFrameNet
from layers.vision.tmrnet import TMRNet

TINY = {
    "channels": 8,
    "n_feat": 1,
    "n_common": 1,
    "n_specific": 1,
    "n_recon": 1,
    "dcn_groups": 2,
    "dcn_impl": "batched",
}


def _bracket(b=2, t=5, hw=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, t, 4, hw, hw, generator=g), torch.randn(b, t, 2, generator=g)


@pytest.mark.parametrize(("scale", "flow"), [(1, "zero"), (4, "oracle"), (1, "learned")])
def test_shapes_and_per_step_outputs(scale, flow):
    net = TMRNet(flow=flow, scale=scale, **TINY)
    x, fl = _bracket()
    y = net(x, fl)
    assert y.shape == (2, 4, 8 * scale, 8 * scale) and torch.isfinite(y).all()
    outs = net(x, fl, return_all=True)
    assert len(outs) == 5 and torch.allclose(outs[-1], y)


def test_alpha_zero_start_equals_the_shared_recurrence_and_gradients_reach_everything():
    torch.manual_seed(0)
    net, shared = TMRNet(**TINY), TMRNet(specific=False, **TINY)
    shared.load_state_dict(net.state_dict(), strict=False)
    x, fl = _bracket()
    assert torch.allclose(net(x, fl), shared(x, fl), atol=1e-6)  # alpha = 0: frame-specific branches are off
    net(x, fl).square().mean().backward()
    assert net.alpha.grad.abs().sum() > 0  # alpha learns first ...
    assert all(float(p.grad.abs().sum()) == 0 for p in net.branches.parameters())  # ... the branches wait for it
    assert float(net.align.offset[0].weight.grad.abs().sum()) == 0  # zero-initialised offset head: offsets = flow
    net.zero_grad()
    with torch.no_grad():
        net.alpha.fill_(0.5)
        net.align.offset[-1].weight.normal_(0, 0.01)
    net(x, fl).square().mean().backward()
    missing = [n for n, p in net.named_parameters() if p.grad is None or float(p.grad.abs().sum()) == 0]
    assert not missing, missing


def test_beta_starts_at_zero_and_learns():
    net = TMRNet(scale=4, **TINY)
    x, fl = _bracket()
    net(x, fl).square().mean().backward()
    assert float(net.recon.beta.abs().sum()) == 0 and net.recon.beta.grad.abs().sum() > 0


def test_fixed_alpha_is_a_buffer():
    net = TMRNet(alpha_init=1.0, alpha_learnable=False, **TINY)
    assert "alpha" not in dict(net.named_parameters()) and float(net.alpha.mean()) == 1.0


def test_batched_dcn_matches_torchvision_in_the_network():
    torch.manual_seed(0)
    tiny = {k: v for k, v in TINY.items() if k != "dcn_impl"}
    a = TMRNet(flow="oracle", dcn_impl="torchvision", **tiny).double()
    b = TMRNet(flow="oracle", dcn_impl="batched", **tiny).double()
    b.load_state_dict(a.state_dict())
    with torch.no_grad():
        a.alpha.fill_(0.3)
        b.alpha.fill_(0.3)
        for net in (a, b):  # non-trivial offsets
            torch.manual_seed(1)
            net.align.offset[-1].weight.normal_(0, 0.1)
    x, fl = _bracket()
    ya, yb = a(x.double(), 2 * fl.double()), b(x.double(), 2 * fl.double())
    assert torch.allclose(ya, yb, atol=1e-10)


def test_baselines_shapes_and_frame_average():
    x, fl = _bracket()
    for net in (SingleFrameNet(8, 1, 1, 1), EarlyFusionNet(5, 8, 1, 1, 1), SingleFrameNet(8, 1, 1, 1, scale=4)):
        y = net(x, fl)
        assert y.shape[:2] == (2, 4) and torch.isfinite(y).all()
    const = torch.full((1, 5, 4, 2, 2), 0.3)
    assert torch.allclose(FrameAverage()(const), torch.full((1, 4, 2, 2), 0.3))
    sat = const.clone()
    sat[:, 4] = 4.0**-2  # the longest frame saturated (normalised clip level 1/16)
    assert float(FrameAverage(masked=True)(sat).mean()) == pytest.approx(0.3)
    assert FrameAverage(scale=4)(const).shape == (1, 4, 8, 8)


def test_bad_input_is_one_clear_error():
    net = TMRNet(**TINY)
    with pytest.raises(ValueError, match=r"expects \[B, 5, 4, h, w\]"):
        net(torch.rand(1, 3, 4, 8, 8))
    with pytest.raises(ValueError, match=r"expects \[B, 5, 4, h, w\]"):
        net(torch.rand(1, 5, 3, 8, 8))
    with pytest.raises(ValueError, match="oracle flow"):
        TMRNet(flow="oracle", **TINY)(torch.rand(1, 5, 4, 8, 8))
    with pytest.raises(ValueError, match="flow="):
        TMRNet(flow="spynet", **TINY)
