"""Static per-tensor activation quantization and BatchNorm folding (ops/quant/static.py) against naive twins."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ops.quant import fake_quant
from ops.quant.static import StaticQuantizer, fake_quant_range, fold_batchnorm, tensor_range


def _naive_tensor_quant(x: torch.Tensor, lo: float, hi: float, bits: int) -> torch.Tensor:
    """One grid for the whole tensor, written out entry by entry."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    qmax = 2**bits - 1
    s = (hi - lo) / qmax
    z = round(-lo / s)
    out = torch.empty_like(x)
    for i, v in enumerate(x.flatten().tolist()):
        out.view(-1)[i] = (min(max(round(v / s) + z, 0), qmax) - z) * s
    return out


def _tokens_with_one_outlier() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 5, 6, generator=g, dtype=torch.float64) * 2 - 1  # [B, T, d] in [-1, 1]
    x[0, 0, 3] = 40.0  # one massive entry in one token
    return x


def test_static_quantizer_uses_one_range_for_every_token() -> None:
    x = _tokens_with_one_outlier()
    q = StaticQuantizer(4)
    q.observing = True
    assert torch.equal(q(x), x)  # observing passes inputs through
    q.observing = False
    assert float(q.lo) == float(x.min()) and float(q.hi) == 40.0
    out = q(x)
    assert torch.allclose(out, _naive_tensor_quant(x, float(x.min()), 40.0, 4), atol=1e-12)
    # the outlier coarsens every token's grid: the small tokens of the other example land on at most 3 levels,
    # where the per-token (dynamic) quantizer keeps them fine
    assert len(torch.unique(out[1])) <= 3
    per_token = fake_quant(x, 4)
    assert (per_token[1] - x[1]).abs().max() < 0.1 < (out[1] - x[1]).abs().max()


def test_static_range_is_fixed_after_calibration_and_covers_every_batch() -> None:
    q = StaticQuantizer(8)
    q.observing = True
    q(torch.tensor([[-1.0, 0.5]]))
    q(torch.tensor([[0.2, 3.0]]))
    q.observing = False
    assert (float(q.lo), float(q.hi)) == (-1.0, 3.0)
    y = q(torch.tensor([[10.0, -5.0, 1.0]]))  # outside the calibrated range: clipped to it
    assert torch.allclose(y, torch.tensor([[3.0, -1.0, 1.0]]), atol=4 / 255)  # one step of the 8-bit grid
    # before calibration: the input's own per-tensor range
    fresh = StaticQuantizer(4)
    x = _tokens_with_one_outlier()
    lo, hi = tensor_range(x)
    assert torch.equal(fresh(x), fake_quant_range(x, lo, hi, 4))
    fresh.enabled = False
    assert torch.equal(fresh(x), x)
    assert torch.equal(StaticQuantizer(16)(x), x)


def test_fake_quant_range_gradient_is_straight_through() -> None:
    x = torch.linspace(-0.7, 0.7, 7, requires_grad=True)  # inside the range, off the end levels: no clipping
    fake_quant_range(x, -1.0, 1.0, 4).sum().backward()
    assert torch.allclose(x.grad, torch.ones(7))


@pytest.mark.parametrize("bias, affine", [(True, True), (False, True), (True, False)])
def test_fold_batchnorm_equals_conv_then_bn(bias: bool, affine: bool) -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 5, 3, padding=1, bias=bias).double()
    bn = nn.BatchNorm2d(5, affine=affine).double()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.3, 3)
        if affine:
            bn.weight.uniform_(0.5, 2)
            bn.bias.uniform_(-2, 2)  # a non-zero shift: a fold that drops beta fails
    bn.eval()
    x = torch.randn(4, 3, 6, 6, dtype=torch.float64)
    w, b = fold_batchnorm(conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.weight, bn.bias, bn.eps)
    assert torch.allclose(F.conv2d(x, w, b, padding=1), bn(conv(x)), rtol=0, atol=1e-12)
