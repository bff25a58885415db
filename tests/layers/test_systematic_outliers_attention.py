"""Attention variants of the systematic-outliers paper: sdpa vs naive parity (float64), equations, gradients."""

from __future__ import annotations

import math

import pytest
import torch

from core.errors import ConfigError
from layers.attention.outlier_variants import VARIANTS, OutlierVariantAttention
from layers.lm import CausalLM


def _pair(variant: str, position: str = "nope") -> tuple[OutlierVariantAttention, OutlierVariantAttention]:
    torch.manual_seed(0)
    fast = OutlierVariantAttention(16, 4, variant, position, "sdpa").double()
    naive = OutlierVariantAttention(16, 4, variant, position, "naive").double()
    naive.load_state_dict(fast.state_dict())
    if fast.v_bias is not None:  # fixed_bias starts at zero: make it non-trivial
        with torch.no_grad():
            fast.v_bias.normal_()
            naive.v_bias.copy_(fast.v_bias)
    return fast, naive


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("position", ["nope", "rope"])
def test_sdpa_matches_naive_outputs_and_grads(variant: str, position: str):
    fast, naive = _pair(variant, position)
    x = torch.randn(2, 7, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = fast(x1), naive(x2)
    torch.testing.assert_close(y1, y2, rtol=1e-10, atol=1e-12)
    (y1.square().sum()).backward()
    (y2.square().sum()).backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-9, atol=1e-11)
    for (n, p1), (_, p2) in zip(fast.named_parameters(), naive.named_parameters()):
        assert p1.grad is not None and p1.grad.abs().sum() > 0, f"{variant}: {n} got no gradient"
        torch.testing.assert_close(p1.grad, p2.grad, rtol=1e-9, atol=1e-11)


def _heads(m: OutlierVariantAttention, x: torch.Tensor):
    b, t, _ = x.shape
    q, k, v = m.qkv_proj(x).view(b, t, 3, m.num_heads, m.head_dim).permute(2, 0, 3, 1, 4)
    return q, k, v


def test_zero_logit_equation():
    _, m = _pair("zero_logit")
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    q, k, v = _heads(m, x)
    s = (q @ k.transpose(-1, -2) / math.sqrt(m.head_dim)).exp().tril()
    y = (s @ v) / (1 + s.sum(-1, keepdim=True))  # sum_j e^{S_j} v_j / (1 + sum_j e^{S_j})
    ref = m.o_proj(y.transpose(1, 2).reshape(1, 5, 16))
    torch.testing.assert_close(m(x), ref)


def test_ca_scale_equation_and_sink_recording():
    _, m = _pair("ca_scale")
    x = torch.randn(1, 5, 16, dtype=torch.float64)
    q, k, v = _heads(m, x)
    p = torch.softmax(
        (q @ k.transpose(-1, -2) / math.sqrt(m.head_dim)).masked_fill(~torch.ones(5, 5).tril().bool(), -math.inf), -1
    )
    sc = 2 * torch.sigmoid(m.scale_proj(x)).transpose(1, 2)[..., None]
    ref = m.o_proj((sc * (p @ v)).transpose(1, 2).reshape(1, 5, 16))
    m.record_attention = True
    torch.testing.assert_close(m(x), ref)
    torch.testing.assert_close(m.last_attention, p)
    assert (sc > 0).all() and (sc < 2).all()


def test_kv_bias_rows_sum_below_one_and_zero_logit_weight():
    _, m = _pair("kv_bias")
    m.record_attention = True
    m(torch.randn(2, 6, 16, dtype=torch.float64))
    rows = m.last_attention.sum(-1)
    assert (rows < 1).all() and (rows > 0).all()  # the extra slot takes 1 - rows


def test_sigmoid_equation():
    _, m = _pair("sigmoid")
    x = torch.randn(1, 4, 16, dtype=torch.float64)
    q, k, v = _heads(m, x)
    a = torch.sigmoid(q @ k.transpose(-1, -2) / math.sqrt(m.head_dim) - math.log(4)).tril()
    torch.testing.assert_close(m(x), m.o_proj((a @ v).transpose(1, 2).reshape(1, 4, 16)))


def test_bad_config_and_lm_integration():
    with pytest.raises(ConfigError, match="variant='nope'"):
        OutlierVariantAttention(16, 4, variant="nope")
    with pytest.raises(ConfigError, match="backend"):
        OutlierVariantAttention(16, 4, backend="flash")
    spec = {"_target_": "layers.attention.outlier_variants.OutlierVariantAttention", "variant": "kv_bias"}
    lm = CausalLM(vocab_size=11, d_model=16, n_layers=2, mixer=[spec], pos_embedding="learned", max_len=8)
    assert isinstance(lm.blocks[1].mixer, OutlierVariantAttention) and lm.blocks[1].mixer.variant == "kv_bias"
    assert lm(torch.randint(0, 11, (2, 8))).shape == (2, 8, 11)
