"""Stick-breaking attention: log-space reference vs product form, blockwise vs reference, stability."""

from __future__ import annotations

import pytest
import torch

from ops.stickbreaking import blockwise_stickbreaking, naive_stickbreaking, product_stickbreaking


def qkv(b, h, t, d, dtype=torch.float64, seed=0, scale=1.0, bias=True):
    gen = torch.Generator().manual_seed(seed)
    # official test inputs: q = 0.25 (N + 1), k = 0.25 (N - 1): negative logits, long sticks
    q = torch.randn(b, h, t, d, generator=gen, dtype=dtype) + (1 if bias else 0)
    k = torch.randn(b, h, t, d, generator=gen, dtype=dtype) - (1 if bias else 0)
    v = torch.randn(b, h, t, d, generator=gen, dtype=dtype)
    return q * 0.25 * scale, k * 0.25 * scale, v * 0.25


def grads(fn, q, k, v, **kw):
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    o, rem = fn(*leaves, **kw)
    gen = torch.Generator().manual_seed(9)
    do = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)
    drem = torch.randn(rem.shape, generator=gen, dtype=torch.float64).to(rem.dtype)
    return o, rem, torch.autograd.grad((o * do).sum() + (rem * drem).sum(), leaves)


@pytest.mark.parametrize("attend_current", [False, True])
def test_log_space_matches_product_form(attend_current):
    q, k, v = qkv(1, 2, 12, 4, scale=4.0, bias=False)
    o1, r1, g1 = grads(naive_stickbreaking, q, k, v, attend_current=attend_current)
    o2, r2, g2 = grads(product_stickbreaking, q, k, v, attend_current=attend_current)
    torch.testing.assert_close(o1, o2, rtol=0, atol=1e-12)
    torch.testing.assert_close(r1, r2, rtol=0, atol=1e-12)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_weights_form_a_stick():
    """sum_j A_ij + rem_i = 1 with rem >= 0; first query has nothing to attend (rem = 1, o = 0)."""
    q, k, v = qkv(2, 2, 30, 8, bias=False, scale=3.0)
    ones = torch.ones_like(v[..., :1])
    mass, rem = naive_stickbreaking(q, k, ones)
    torch.testing.assert_close(mass[..., 0] + rem, torch.ones_like(rem), rtol=0, atol=1e-12)
    assert (rem >= 0).all() and (mass >= 0).all()
    assert torch.equal(rem[..., 0], torch.ones_like(rem[..., 0])) and torch.equal(mass[..., 0, 0], mass.new_zeros(2, 2))
    o, rem_cur = naive_stickbreaking(q[..., :1, :], k[..., :1, :], ones[..., :1, :], attend_current=True)
    torch.testing.assert_close(o[..., 0, 0] + rem_cur[..., 0], torch.ones(2, 2, dtype=torch.float64))


def test_recency_bias():
    """Equal logits: weights decay geometrically with distance, A_{i,i-1-m} = s (1 - s)^m."""
    t = 6
    q = torch.zeros(1, 1, t, 2, dtype=torch.float64)
    q[..., 0] = 1.0
    k = q.clone()
    ident = torch.eye(t, dtype=torch.float64)[None, None]
    a, _ = naive_stickbreaking(q, k, ident, inv_temp=0.0)  # z = 0 -> beta = 1/2
    assert a[0, 0, 5, 4] == pytest.approx(0.5) and a[0, 0, 5, 2] == pytest.approx(0.125)


@pytest.mark.parametrize(
    ("t", "block", "attend_current"), [(1, 4, False), (37, 8, False), (64, 16, True), (100, 32, True)]
)
def test_blockwise_matches_naive_float64(t, block, attend_current):
    q, k, v = qkv(2, 2, t, 8, seed=t)
    o1, r1, g1 = grads(naive_stickbreaking, q, k, v, attend_current=attend_current)
    o2, r2, g2 = grads(blockwise_stickbreaking, q, k, v, attend_current=attend_current, block_size=block)
    torch.testing.assert_close(o2, o1, rtol=0, atol=1e-12)
    torch.testing.assert_close(r2, r1, rtol=0, atol=1e-12)
    for name, a, b in zip("qkv", g1, g2):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-10, msg=f"grad {name}")
    assert t == 1 or g1[0].abs().max() > 1e-4


def test_blockwise_float32_tolerance():
    q, k, v = qkv(1, 2, 300, 16, seed=4)
    o1, r1, g1 = grads(naive_stickbreaking, q, k, v)
    o2, r2, g2 = grads(blockwise_stickbreaking, *(x.float() for x in (q, k, v)), block_size=64)
    assert o2.dtype == torch.float32
    assert (o2.double() - o1).abs().max() < 1e-5 and (r2.double() - r1).abs().max() < 1e-5
    for a, b in zip(g1, g2):
        assert (b.double() - a).abs().max() < 1e-4


def test_large_logits_stay_finite():
    """Logits scaled by 50: the log-space forms stay finite where log(1 - sigmoid) underflows."""
    q, k, v = qkv(1, 1, 40, 8, scale=200.0, bias=False, seed=2)
    for fn in (naive_stickbreaking, blockwise_stickbreaking):
        o, rem, g = grads(fn, q.float(), k.float(), v.float())
        assert all(torch.isfinite(x).all() for x in (o, rem, *g)), fn.__name__
    naive_product = torch.log(1 - torch.sigmoid(torch.tensor(60.0)))
    assert torch.isinf(naive_product)  # what the product form would hit


def test_blockwise_stable_at_8192():
    """T = 8192 forward + backward of the blockwise op: no NaN or inf (tiny B, H, D)."""
    q, k, v = qkv(1, 1, 8192, 8, dtype=torch.float32, seed=1, scale=4.0)
    o, rem, (dq, dk, dv) = grads(blockwise_stickbreaking, q, k, v, block_size=1024)
    for x in (o, rem, dq, dk, dv):
        assert torch.isfinite(x).all()
    assert (rem >= 0).all() and (rem <= 1).all() and o.abs().max() > 0


def test_bad_inputs_raise():
    q, k, v = qkv(1, 1, 8, 4)
    with pytest.raises(ValueError, match="same head dim"):
        naive_stickbreaking(q, k[..., :2], v)
    with pytest.raises(ValueError, match="power of two"):
        blockwise_stickbreaking(q, k, v, block_size=24)
    with pytest.raises(ValueError, match=r"\[B, H, T, D\]"):
        blockwise_stickbreaking(q[0], k[0], v[0])


@pytest.mark.parametrize(
    ("t", "block", "rows", "attend_current"), [(100, 8, 16, False), (77, 16, 8, True), (64, 4, 64, True)]
)
def test_row_tiles_match_naive_float64(t, block, rows, attend_current):
    """Query-row tiling (M != N, ragged last tiles) gives the same outputs and gradients as the naive form."""
    q, k, v = qkv(2, 2, t, 8, seed=t + 1)
    o1, r1, g1 = grads(naive_stickbreaking, q, k, v, attend_current=attend_current)
    o2, r2, g2 = grads(
        blockwise_stickbreaking, q, k, v, attend_current=attend_current, block_size=block, row_block=rows
    )
    torch.testing.assert_close(o2, o1, rtol=0, atol=1e-12)
    torch.testing.assert_close(r2, r1, rtol=0, atol=1e-12)
    for name, a, b in zip("qkv", g1, g2):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-10, msg=f"grad {name}")


def test_blockwise_saves_no_quadratic_state():
    """Autograd keeps only O(T D) tensors for the blockwise op (q, k, v, o, rem), the naive op keeps T x T ones."""
    q, k, v = (x.requires_grad_(True) for x in qkv(1, 2, 256, 8, dtype=torch.float32, seed=3))
    sizes = {}
    for fn in (naive_stickbreaking, blockwise_stickbreaking):
        saved: list[int] = []

        def pack(x: torch.Tensor, saved: list[int] = saved) -> torch.Tensor:
            saved.append(x.numel())
            return x

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            fn(q, k, v)
        sizes[fn.__name__] = (sum(saved), max(saved))
    assert sizes["blockwise_stickbreaking"][1] <= 2 * 256 * 8  # q, k, v, o: B H T D
    assert sizes["naive_stickbreaking"][1] >= 2 * 256 * 256
