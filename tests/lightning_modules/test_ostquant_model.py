"""OSTQuant model rewrite (layers.quant.ostquant): equivalence before quantization on every LM mixer of the suite,
orthogonality while learning, KL-Top calibration lowers the loss, weight freezing, and bad-input errors."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from callbacks.quant_calibration import QuantCalibration
from core.errors import ConfigError
from layers.attention.outlier_variants import OutlierVariantAttention
from layers.lm import CausalLM
from layers.quant.ostquant import TransformedLM
from ops.quant import kl_top

MIXERS = {
    "softmax_variant": partial(OutlierVariantAttention, num_heads=4, variant="softmax"),
    "ca_scale": partial(OutlierVariantAttention, num_heads=4, variant="ca_scale"),
    "kv_bias": partial(OutlierVariantAttention, num_heads=4, variant="kv_bias"),
    "softmax_rope": {"kind": "softmax", "num_heads": 4},
    "gated_deltanet": {"kind": "gated_deltanet", "num_heads": 2},
    "stickbreaking": {"kind": "stickbreaking", "num_heads": 4},
}


def _lm(mixer, seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    net = CausalLM(40, 32, 2, mixer=[mixer], pos_embedding="learned", max_len=16)
    with torch.no_grad():  # non-trivial norm weights, so that fusing them is tested
        for n, p in net.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 2.0)
    return net.eval()


@pytest.mark.parametrize("name", list(MIXERS))
@pytest.mark.parametrize("init", ["hadamard", "klt_hadamard"])
def test_full_precision_equivalence(name: str, init: str):
    net = _lm(MIXERS[name])
    ids = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(1))
    t = TransformedLM(net, init=init)
    with torch.no_grad():
        for s in t.scales.values():
            s.uniform_(0.5, 2.0)
        t.set_quant(False)
        ref, out = net(ids), t(ids)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
        t.set_quant(True)
        assert (t(ids) - ref).abs().max() > 1e-3  # W16A4KV4 changes the outputs
    torch.testing.assert_close(t.rotation.T @ t.rotation, torch.eye(32), atol=1e-5, rtol=0)
    assert net.lm_head.weight is net.embed.weight  # the original model is untouched


HEAD_MIXERS = {
    **{v: partial(OutlierVariantAttention, num_heads=4, variant=v) for v in ("zero_logit", "fixed_bias", "ca_bias")},
    "sigmoid": partial(OutlierVariantAttention, num_heads=4, variant="sigmoid"),
    "kv_bias_rope": partial(OutlierVariantAttention, num_heads=4, variant="kv_bias", position="rope"),
    "softmax_rope": {"kind": "softmax", "num_heads": 4},
    "stickbreaking_no_norm": {"kind": "stickbreaking", "num_heads": 4, "group_norm": False},
}


@pytest.mark.parametrize("name", list(HEAD_MIXERS))
def test_head_transforms_are_equivalent(name: str):
    """S_qk, R_ov, S_ov (OSTQuant Sec. 4.2) leave the full-precision logits unchanged, biases of the variants too."""
    net = _lm(HEAD_MIXERS[name])
    with torch.no_grad():
        for n, p in net.named_parameters():
            if n.endswith(("k_bias", "v_bias", "head_bias")):
                p.normal_()  # fixed_bias / head_bias start at zero: make them matter
    ids = torch.randint(0, 40, (2, 16), generator=torch.Generator().manual_seed(1))
    t = TransformedLM(net, init="klt_hadamard")
    assert {"qk0", "ov0", "qk1", "ov1"} <= set(t.scales) and set(t.head_rotations) == {"ov0", "ov1"}
    with torch.no_grad():
        for s in t.scales.values():
            s.uniform_(0.5, 2.0)
        qkv = t.linears["blocks.0.mixer.qkv_proj"]
        w, _ = qkv.effective()
        d = w.shape[0] // 3
        plain = qkv.w0 @ t.rotation * t.scales["attn0"][None, :]  # without the head transforms
        assert (w[:d] - plain[:d]).abs().max() > 1e-3 and (w[2 * d :] - plain[2 * d :]).abs().max() > 1e-3
        t.set_quant(False)
        torch.testing.assert_close(t(ids), net(ids), atol=1e-5, rtol=0)
    for r in t.head_rotations.values():
        torch.testing.assert_close(r.mT @ r, torch.eye(8).expand(4, 8, 8), atol=1e-5, rtol=0)


def test_head_transforms_only_where_exact():
    gdn = TransformedLM(_lm(MIXERS["gated_deltanet"]))  # conv + SiLU on q/k/v: no head transforms
    assert not gdn.head_rotations and not any(k.startswith(("qk", "ov")) for k in gdn.scales)
    sb = TransformedLM(_lm(MIXERS["stickbreaking"]))  # GroupNorm over heads: S_qk only, K/V quantized at qkv_proj
    assert not sb.head_rotations and {"qk0", "qk1"} <= set(sb.scales) and "ov0" not in sb.scales
    assert sb.linears["blocks.0.mixer.qkv_proj"].kv_out_quant
    rope = TransformedLM(_lm(MIXERS["softmax_rope"]))  # RoPE: one S_qk per rotated pair
    assert rope.scales["qk0"].shape == (4, 4)
    off = TransformedLM(_lm(MIXERS["softmax_variant"]), head_transforms=False)
    assert not off.head_rotations and len(off.rotation_parameters()) == 1


def test_learning_keeps_orthogonality_and_lowers_kl_top():
    torch.manual_seed(0)
    mixer = MIXERS["softmax_variant"]
    net = CausalLM(40, 32, 2, mixer=[mixer], pos_embedding="learned", max_len=16, tie_embeddings=False).eval()
    with torch.no_grad():  # peaked predictions (a random init is near uniform) and an outlier channel
        net.lm_head.weight.mul_(100.0)
        net.embed.weight[:, 3] += 2.0
    ids = torch.randint(0, 40, (8, 17), generator=torch.Generator().manual_seed(2))
    calib = [{"input_ids": ids[:, :-1], "labels": ids[:, 1:]}]
    cb = QuantCalibration(methods=["ostquant"], w_bits=16, a_bits=4, kv_bits=4, rotate_lr=0.05, smooth_lr=0.03)
    t = TransformedLM(net, "klt_hadamard", w_bits=16, a_bits=4, kv_bits=4)
    r_ov0 = t.head_rotations["ov0"].detach().clone()
    with torch.no_grad():
        before = kl_top(net(calib[0]["input_ids"]), t(calib[0]["input_ids"])).item()
    cb._learn(net, t, calib, steps=30, learn_scales=True, loss="kl_top")
    with torch.no_grad():
        after = kl_top(net(calib[0]["input_ids"]), t(calib[0]["input_ids"])).item()
    assert after < 0.7 * before, (before, after)
    torch.testing.assert_close(t.rotation.T @ t.rotation, torch.eye(32), atol=1e-5, rtol=0)
    for r in t.head_rotations.values():  # per-head R_ov [H, D, D] stay on the Stiefel manifold
        torch.testing.assert_close(r.mT @ r, torch.eye(8).expand(4, 8, 8), atol=1e-5, rtol=0)
    assert (t.head_rotations["ov0"] - r_ov0).abs().max() > 1e-4  # R_ov was learned
    assert any((s - 1).abs().max() > 1e-4 for s in t.scale_parameters())  # the scales moved


def test_freeze_rtn_and_gptq_quantize_weights():
    net = _lm(MIXERS["softmax_variant"])
    ids = torch.randint(0, 40, (4, 16), generator=torch.Generator().manual_seed(3))
    for wq in ("rtn", "gptq"):
        t = TransformedLM(net, "hadamard", w_bits=4, a_bits=16, kv_bits=16)
        if wq == "gptq":
            with pytest.raises(ConfigError, match="collect_hessians"):
                t.freeze("gptq")
            t.collect_hessians([ids])
        t.freeze(wq)
        w = t.linears["blocks.0.mlp.down_proj"].w_frozen
        assert max(len(torch.unique(r)) for r in w) <= 16  # 4-bit per output channel
        assert torch.isfinite(t(ids)).all()


def test_bad_inputs():
    with pytest.raises(ConfigError, match="2..8"):
        TransformedLM(_lm(MIXERS["softmax_variant"]), a_bits=1)
    with pytest.raises(ConfigError, match="2..8"):
        QuantCalibration(w_bits=9)
    with pytest.raises(ConfigError, match="w_group_size .*blocks.0.mixer.qkv_proj.*divisor"):
        TransformedLM(_lm(MIXERS["softmax_variant"]), w_bits=4, w_group_size=5)
    with pytest.raises(ConfigError, match="a_group_size"):
        TransformedLM(_lm(MIXERS["softmax_variant"]), a_group_size=7)
    with pytest.raises(ConfigError, match="methods"):
        QuantCalibration(methods=["awq"])

    class Conv(nn.Module):  # a mixer without linear layers
        def __init__(self, d_model: int) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(d_model))

        def forward(self, x):
            return x * self.w

    with pytest.raises(ConfigError, match="no supported linear layers"):
        TransformedLM(CausalLM(40, 32, 1, mixer=[Conv]))
    with pytest.raises(ConfigError, match="not a supported causal LM"):
        TransformedLM(nn.Linear(3, 3))


def test_freeze_searches_clip_ratios_by_default():
    """Frozen weights get the official 80-ratio, exponent-2.4 clip search unless switched off."""
    from ops.quant import rtn_weight

    net = _lm(MIXERS["softmax_variant"])
    t = TransformedLM(net, "hadamard", w_bits=4, a_bits=16, kv_bits=16)
    t.freeze("rtn")
    lin = t.linears["blocks.0.mlp.down_proj"]
    w = lin.effective()[0]
    torch.testing.assert_close(lin.w_frozen, rtn_weight(w, 4, clip_search=True, clip_norm=2.4), rtol=0, atol=0)
    assert not torch.equal(lin.w_frozen, rtn_weight(w, 4))
    off = TransformedLM(net, "hadamard", w_bits=4, a_bits=16, kv_bits=16)
    off.freeze("rtn", clip_search=False)
    torch.testing.assert_close(off.linears["blocks.0.mlp.down_proj"].w_frozen, rtn_weight(w, 4), rtol=0, atol=0)
    old = TransformedLM(net, "hadamard", w_bits=4, a_bits=16, kv_bits=16, w_sym_scale="absmax")
    old.freeze("rtn", clip_search=False)
    expect = rtn_weight(w, 4, sym_scale="absmax")
    torch.testing.assert_close(old.linears["blocks.0.mlp.down_proj"].w_frozen, expect, rtol=0, atol=0)
    cb = QuantCalibration(methods=["rtn"])
    assert cb.clip == {"clip_search": True, "clip_grid": "official", "clip_norm": 2.4} and cb.w_sym_scale == "signed"
    with pytest.raises(ConfigError, match="w_sym_scale"):
        QuantCalibration(methods=["rtn"], w_sym_scale="max")
    with pytest.raises(ConfigError, match="clip_grid"):
        QuantCalibration(methods=["rtn"], w_clip_grid="fine")


def test_klt_init_uses_the_centred_row_covariance():
    """R_res = KLT(centred covariance of the input-side weight rows) @ H and R_ov likewise."""
    from ops.quant import weight_klt

    net = _lm(MIXERS["softmax_variant"])
    cen = TransformedLM(net, "klt_hadamard")
    unc = TransformedLM(net, "klt_hadamard", klt_centered=False)  # same seed: same Hadamard H
    rows = torch.cat([lin.w0 for lin in cen.linears.values() if lin.in_rot])
    k_c, k_u = weight_klt(rows, True).float(), weight_klt(rows, False).float()
    h = k_u.T @ unc.rotation  # the Hadamard factor, recovered from the uncentred model
    torch.testing.assert_close(cen.rotation, k_c @ h, atol=1e-5, rtol=0)
    assert (cen.rotation - unc.rotation).abs().max() > 1e-2  # the mean row matters on this model
    o = cen.linears["blocks.0.mixer.o_proj"].w0.view(-1, 4, 8).transpose(0, 1)  # [H, out, D]
    h_ov = weight_klt(o, False).float().mT @ unc.head_rotations["ov0"]
    torch.testing.assert_close(cen.head_rotations["ov0"], weight_klt(o, True).float() @ h_ov, atol=1e-5, rtol=0)
