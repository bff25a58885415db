"""Token mixers and the causal LM: shapes, causality, gradients to every parameter, config errors."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from core.errors import ConfigError
from layers.attention import GatedDeltaNet, ShortConvolution, SoftmaxAttention, StickBreakingAttention
from layers.lm import CausalLM, build_mixer

MIXERS = {
    "gdn": {"kind": "gated_deltanet", "num_heads": 2, "chunk_size": 8},
    "deltanet": {"kind": "gated_deltanet", "num_heads": 2, "use_gate": False, "chunk_size": 8},
    "mamba2": {"kind": "gated_deltanet", "num_heads": 2, "use_delta": False, "chunk_size": 8},
    "rope": {"kind": "softmax", "num_heads": 2},
    "nope": {"kind": "softmax", "num_heads": 2, "position": "nope"},
    "swa": {"kind": "softmax", "num_heads": 2, "window": 4},
    "sb": {"kind": "stickbreaking", "num_heads": 2, "block_size": 8},
    "sb_value": {"kind": "stickbreaking", "num_heads": 2, "remainder": "value", "group_norm": False},
}


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_mixer_shapes_causality_and_gradients(name):
    torch.manual_seed(0)
    mixer = build_mixer(MIXERS[name], 32).double()
    x = torch.randn(2, 21, 32, dtype=torch.float64, requires_grad=True)
    y = mixer(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    # causality: changing token 15 leaves outputs 0..14 unchanged
    x2 = x.detach().clone()
    x2[:, 15] += 1.0
    y2 = mixer(x2)
    torch.testing.assert_close(y2[:, :15], y[:, :15].detach(), rtol=0, atol=1e-12)
    assert (y2[:, 15:] - y[:, 15:]).abs().max() > 1e-6
    y.pow(2).sum().backward()
    for n, p in mixer.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0, n


def test_gdn_chunk_and_recurrent_backends_agree():
    torch.manual_seed(0)
    layer = GatedDeltaNet(32, num_heads=2, chunk_size=4).double()
    x = torch.randn(2, 19, 32, dtype=torch.float64)
    y = layer(x)
    layer.backend = "recurrent"
    torch.testing.assert_close(layer(x), y, rtol=0, atol=1e-10)
    g = layer.gate(x)
    assert (g <= 0).all() and g.shape == (2, 19, 2)


def test_gdn_default_sizes_follow_paper():
    layer = GatedDeltaNet(64, num_heads=2)
    assert layer.head_dim == 24 and layer.v_dim == 48  # keys 0.75 d, values 1.5 d
    assert layer.A_log._no_weight_decay and layer.dt_bias._no_weight_decay
    assert (layer.A_log.exp() <= 16).all()


def test_gdn_write_strength_starts_without_offset():
    """beta = sigmoid(W_b x + b) starts with b = 0, as in both references (the NVlabs recipe zeroes every Linear bias
    at init, fla's b_proj has no bias), also inside a CausalLM whose init touches only weights; PyTorch's default
    would start each head's beta at sigmoid(U(-1/8, 1/8)) for d = 64."""
    torch.manual_seed(0)
    layer = GatedDeltaNet(64, num_heads=8)
    assert torch.equal(layer.b_proj.bias, torch.zeros(8))
    torch.testing.assert_close(layer.b_proj(torch.zeros(3, 64)).sigmoid(), torch.full((3, 8), 0.5))
    lm = CausalLM(32, 64, 2, mixer={"kind": "gated_deltanet", "num_heads": 4, "use_gate": False})
    for block in lm.blocks:
        assert torch.equal(block.mixer.b_proj.bias, torch.zeros(4))
    assert layer.b_proj.bias.requires_grad  # zero at init, trained like NVlabs' bias (not removed)


def test_gdn_conv_init_std_option():
    """``conv_init_std=0.02`` draws the short convolutions from N(0, 0.02^2) (fla's model init), also inside a
    CausalLM (whose init leaves Conv1d alone); the default keeps PyTorch's kaiming-uniform (|w| <= 1/2 for 4 taps)."""
    torch.manual_seed(0)
    default = GatedDeltaNet(64, num_heads=2, head_dim=32, expand_v=1.0)
    w = torch.cat([c.conv.weight.flatten() for c in default.convs])
    assert w.abs().max() <= 0.5 and w.std() > 0.25  # U(-1/2, 1/2) has std 0.289
    lm = CausalLM(
        32,
        64,
        2,
        mixer={"kind": "gated_deltanet", "num_heads": 2, "head_dim": 32, "expand_v": 1.0, "conv_init_std": 0.02},
    )
    for block in lm.blocks:
        w = torch.cat([c.conv.weight.flatten() for c in block.mixer.convs])  # 3 x 64 channels x 4 taps = 768 draws
        assert 0.018 < w.std() < 0.022 and w.abs().max() < 0.1
    with pytest.raises(ConfigError, match="conv_init_std"):
        GatedDeltaNet(64, conv_init_std=0.0)


def test_gdn_gate_init_ranges():
    """The default init is Mamba2's / the paper's (A in [0, 16], dt in [1e-3, 0.1]) and draws the same numbers as
    before the ranges were exposed; a narrower dt range starts the gate near 1; bad ranges are config errors."""
    torch.manual_seed(3)
    default = GatedDeltaNet(64, num_heads=8)
    torch.manual_seed(3)  # the projections created before the gate draw from the same generator
    key, value = default.num_heads * default.head_dim, default.num_heads * default.v_dim
    for out, bias in ((key, False), (key, False), (value, False), (8, True), (8, False)):  # q, k, v, b, a
        torch.nn.Linear(64, out, bias=bias)
    a = torch.empty(8).uniform_(0, 16).clamp_min(1e-4)
    dt = torch.exp(torch.rand(8) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp_min(1e-4)
    torch.testing.assert_close(default.A_log.exp(), a)
    torch.testing.assert_close(torch.nn.functional.softplus(default.dt_bias), dt)
    slow = GatedDeltaNet(64, num_heads=8, a_init_range=(1, 2), dt_init_range=(1e-4, 1e-3))
    dt = torch.nn.functional.softplus(slow.dt_bias)
    assert ((slow.A_log.exp() >= 1) & (slow.A_log.exp() <= 2)).all() and ((dt >= 9.9e-5) & (dt <= 1.01e-3)).all()
    with pytest.raises(ConfigError, match="a_init_range"):
        GatedDeltaNet(64, a_init_range=(2, 1))
    with pytest.raises(ConfigError, match="dt_init_range"):
        GatedDeltaNet(64, dt_init_range=(0, 0.1))
    with pytest.raises(ConfigError, match="a_init_range"):
        GatedDeltaNet(64, a_init_range=(1,))


def test_stickbreaking_backends_agree():
    torch.manual_seed(0)
    layer = StickBreakingAttention(32, num_heads=4, block_size=8).double()
    x = torch.randn(2, 30, 32, dtype=torch.float64)
    y = layer(x)
    layer.backend = "naive"
    torch.testing.assert_close(layer(x), y, rtol=0, atol=1e-10)


def test_sliding_window_limits_receptive_field():
    torch.manual_seed(0)
    layer = SoftmaxAttention(16, num_heads=2, window=3).double()
    x = torch.randn(1, 10, 16, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 2] += 1.0
    y, y2 = layer(x), layer(x2)
    assert (y2[:, 2:5] - y[:, 2:5]).abs().max() > 1e-6  # positions 2..4 see token 2
    torch.testing.assert_close(y2[:, 5:], y[:, 5:], rtol=0, atol=1e-12)  # position 5 no longer does


def test_short_convolution_is_causal_depthwise():
    conv = ShortConvolution(3, 4).double()
    x = torch.zeros(1, 8, 3, dtype=torch.float64)
    x[0, 2, 1] = 1.0
    y = conv(x)
    assert y[0, :2].abs().max() == 0 and y[0, 6:].abs().max() == 0  # only t = 2..5 see the impulse
    assert y[0, :, [0, 2]].abs().max() == 0  # depthwise


def test_hybrid_pattern_and_hidden_states():
    lm = CausalLM(50, 32, 4, mixer=[MIXERS["gdn"], MIXERS["swa"]])
    kinds = [type(b.mixer).__name__ for b in lm.blocks]
    assert kinds == ["GatedDeltaNet", "SoftmaxAttention"] * 2
    logits, hidden = lm(torch.randint(0, 50, (2, 12)), return_hidden=True)
    assert logits.shape == (2, 12, 50) and len(hidden) == 5 and hidden[-1].shape == (2, 12, 32)
    assert lm.lm_head.weight is lm.embed.weight


def test_mixer_from_target_and_partial():
    a = build_mixer({"_target_": "layers.attention.SoftmaxAttention", "num_heads": 4}, 32)
    b = build_mixer(functools.partial(SoftmaxAttention, num_heads=4), 32)
    assert a.num_heads == b.num_heads == 4


def test_config_errors():
    with pytest.raises(ConfigError, match="power of two"):
        GatedDeltaNet(32, chunk_size=48)
    with pytest.raises(ConfigError, match="divisible"):
        SoftmaxAttention(30, num_heads=4)
    with pytest.raises(ConfigError, match="remainder"):
        StickBreakingAttention(32, remainder="bias")
    with pytest.raises(ConfigError, match="kind"):
        build_mixer({"kind": "mamba"}, 32)
    with pytest.raises(ConfigError, match="max_len"):
        CausalLM(10, 16, 1, MIXERS["nope"], pos_embedding="learned")
    lm = CausalLM(10, 16, 1, MIXERS["nope"], pos_embedding="learned", max_len=8)
    assert lm(torch.zeros(1, 8, dtype=torch.long)).shape == (1, 8, 10)
    with pytest.raises(ValueError, match="exceeds the learned position table"):
        lm(torch.zeros(1, 9, dtype=torch.long))
