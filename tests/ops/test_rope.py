"""RoPE of TULIP: the relative property, the three forms agree (float64, outputs and gradients), NTK by hand."""

from __future__ import annotations

import math

import pytest
import torch

from core.errors import ConfigError
from ops.rope import apply_rope, apply_rope_complex, naive_apply_rope, ntk_theta, rope_angles, rope_cis, rope_cos_sin


def test_rotated_dot_product_depends_only_on_the_offset():
    torch.manual_seed(0)
    d, length = 16, 40
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    angles = rope_angles(length, d, 10000.0)
    rq = naive_apply_rope(q.expand(1, 1, length, d), angles)[0, 0]  # q placed at every position m
    rk = naive_apply_rope(k.expand(1, 1, length, d), angles)[0, 0]
    dots = rq @ rk.T  # [m, n]
    for offset in (-7, 0, 3, 11):
        diag = torch.diagonal(dots, offset=-offset)  # entries with m - n = offset
        assert diag.numel() > 10
        torch.testing.assert_close(diag, diag[:1].expand_as(diag), rtol=0, atol=1e-10)
    assert (dots.diagonal(0)[0] - dots.diagonal(-3)[0]).abs() > 1e-3  # and does depend on the offset


def test_complex_and_elementwise_forms_equal_the_pairwise_rotation():
    torch.manual_seed(1)
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64, requires_grad=True)
    angles = rope_angles(9, 8, 500.0)
    ref = naive_apply_rope(x, angles)
    cos, sin = rope_cos_sin(angles, torch.float64)
    for out in (apply_rope_complex(x, rope_cis(angles)), apply_rope(x, cos, sin)):
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
        g = torch.randn_like(out)
        (gx,) = torch.autograd.grad(out, x, g)
        (gr,) = torch.autograd.grad(ref, x, g, retain_graph=True)
        torch.testing.assert_close(gx, gr, rtol=1e-12, atol=1e-12)
    # interleaved convention: the first pair (x0, x1) at position 1 turns by omega_0 = 1 radian
    e = torch.zeros(1, 1, 2, 8, dtype=torch.float64)
    e[..., 0] = 1.0
    out = naive_apply_rope(e, angles[:2])
    assert out[0, 0, 1, 0].item() == pytest.approx(math.cos(1.0)) and out[0, 0, 1, 1].item() == pytest.approx(
        math.sin(1.0)
    )


def test_ntk_formula_against_hand_values():
    # d = 4 makes the exponent d / (d - 2) = 2: theta' = theta * (s * L_new / L_old - (s - 1)) ** 2
    assert ntk_theta(10000.0, 2.0, 64, 32, 4) == pytest.approx(10000.0 * 3.0**2)
    assert ntk_theta(10000.0, 8.0, 64, 32, 4) == pytest.approx(10000.0 * 9.0**2)
    assert ntk_theta(10000.0, 8.0, 77, 77, 64) == pytest.approx(10000.0)  # no expansion: unchanged for any s
    # d = 64, s = 8, 77 -> 231: (8 * 3 - 7) ** (64 / 62) = 17 ** 1.0322580645...
    assert ntk_theta(10000.0, 8.0, 231, 77, 64) == pytest.approx(10000.0 * 18.6266, rel=1e-4)
    # the official defaults (L_new 231 < L_old 248) shrink the base instead of growing it
    assert ntk_theta(10000.0, 8.0, 231, 248, 64) < 10000.0
    with pytest.raises(ConfigError, match="must be > 0"):
        ntk_theta(10000.0, 8.0, 100, 248, 64)


def test_infinite_base_leaves_the_first_pair_turning():
    """theta -> inf is not the identity: omega_0 = theta^0 = 1 for every base, so only zero angles are."""
    x = torch.randn(1, 2, 5, 6, dtype=torch.float64)
    out = naive_apply_rope(x, rope_angles(5, 6, math.inf))
    torch.testing.assert_close(out[..., 2:], x[..., 2:], rtol=0, atol=0)
    assert (out[..., 1:, :2] - x[..., 1:, :2]).abs().max() > 1e-3
    torch.testing.assert_close(naive_apply_rope(x, torch.zeros(5, 3, dtype=torch.float64)), x, rtol=0, atol=0)
