"""Quantization ops of OSTQuant: fake quant, GPTQ (fast vs naive, float64), transforms, Cayley, QSUR, KL-Top."""

from __future__ import annotations

import math

import pytest
import torch

from core.errors import ConfigError
from ops.quant import (
    CayleySGD,
    cayley_retraction,
    clip_ratios,
    fake_quant,
    gptq,
    gptq_naive,
    hadamard,
    input_hessian,
    kl_full,
    kl_top,
    klt,
    log_qsur,
    qsur,
    random_hadamard,
    row_covariance,
    rtn_weight,
    weight_klt,
)


def test_fake_quant_levels_and_exact_grid():
    x = torch.tensor([[-1.0, -0.5, 0.0, 0.25, 1.0]])
    q = fake_quant(x, 2, symmetric=True)  # scale = 1 / 1, levels {-2, -1, 0, 1}
    assert q.tolist() == [[-1.0, 0.0, 0.0, 0.0, 1.0]]  # torch.round is half-to-even: -0.5 -> 0, 0.25 -> 0
    a = fake_quant(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), 2, symmetric=False)  # 4 levels exactly on the grid
    assert a.tolist() == [[0.0, 1.0, 2.0, 3.0]]
    y = torch.randn(8, 32, generator=torch.Generator().manual_seed(0))
    for bits in (2, 4, 8):
        qy = fake_quant(y, bits)
        assert max(len(torch.unique(r)) for r in qy) <= 2**bits
    err4, err8 = (fake_quant(y, 4) - y).abs().max(), (fake_quant(y, 8) - y).abs().max()
    assert err8 < err4 / 8


def test_grouping_and_ste_gradient():
    x = torch.cat([torch.ones(1, 4) * 0.01, torch.ones(1, 4) * 100], dim=1) + torch.linspace(0, 0.001, 8)
    g = fake_quant(x, 4, group_size=4)
    assert (g[0, :4] - x[0, :4]).abs().max() < 1e-3  # its own scale keeps the small group accurate
    assert (fake_quant(x, 4)[0, :4] - x[0, :4]).abs().max() > 1e-3
    xr = torch.randn(3, 8, requires_grad=True)
    fake_quant(xr, 4).sum().backward()
    assert xr.grad is not None and xr.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"bits": 1}, "2..8"),
        ({"bits": 9}, "2..8"),
        ({"bits": 4, "group_size": 5}, "divisor"),
        ({"bits": 4, "clip_ratio": 0}, "clip"),
    ],
)
def test_bad_bits_and_groups(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        fake_quant(torch.randn(2, 8), **kwargs)


def test_rtn_clip_search_never_worse():
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
    w[0, 0] = 20.0
    plain = rtn_weight(w, 4)
    for norm in (2.0, 2.4):  # the search minimises sum |q - w|^norm: never worse than no clipping in that norm
        searched = rtn_weight(w, 4, clip_search=True, clip_norm=norm)
        assert (searched - w).abs().pow(norm).sum(-1).le((plain - w).abs().pow(norm).sum(-1) + 1e-9).all()


@pytest.mark.parametrize("group_size", [None, 4])
@pytest.mark.parametrize("symmetric", [True, False])
def test_gptq_fast_matches_naive_float64(group_size, symmetric):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 16, dtype=torch.float64, generator=g)
    x = torch.randn(200, 16, dtype=torch.float64, generator=g) @ torch.randn(16, 16, dtype=torch.float64, generator=g)
    h = input_hessian(x)
    fast = gptq(w, h, 3, group_size, symmetric, block_size=5)
    naive = gptq_naive(w, h, 3, group_size, symmetric)
    torch.testing.assert_close(fast, naive, rtol=0, atol=1e-12)
    clipped = gptq(w, h, 3, group_size, symmetric, block_size=5, clip_search=True)  # the official w_clip path too
    clipped_naive = gptq_naive(w, h, 3, group_size, symmetric, clip_search=True)
    torch.testing.assert_close(clipped, clipped_naive, rtol=0, atol=1e-12)
    rtn = fake_quant(w, 3, symmetric, group_size)
    # GPTQ minimises the layer-output error, so it beats RTN on the calibration inputs
    assert ((x @ (fast - w).T) ** 2).sum() < 0.8 * ((x @ (rtn - w).T) ** 2).sum()


def test_hadamard_klt_orthogonal():
    h = hadamard(8, torch.float64)
    torch.testing.assert_close(h @ h.T, torch.eye(8, dtype=torch.float64))
    assert torch.allclose(h.abs(), torch.full((8, 8), 1 / math.sqrt(8), dtype=torch.float64))
    r = random_hadamard(16, torch.Generator().manual_seed(0))
    torch.testing.assert_close(r @ r.T, torch.eye(16), atol=1e-6, rtol=0)
    # QuaRot's order diag(s) H: a common-mode vector is spread, not sent to one channel (as H diag(s) would)
    assert (torch.ones(16) @ r).abs().max() < 0.75 * 4.0
    signs = torch.tensor([1.0, -1.0] * 8)
    assert (torch.ones(16) @ (hadamard(16) * signs[None])).abs().max() == pytest.approx(4.0)
    r12 = random_hadamard(12, torch.Generator().manual_seed(0))  # not a power of two: random orthogonal
    torch.testing.assert_close(r12 @ r12.T, torch.eye(12), atol=1e-6, rtol=0)
    with pytest.raises(ConfigError, match="power of two"):
        hadamard(12)
    cov = torch.diag(torch.tensor([1.0, 5.0, 3.0]))
    assert klt(cov).abs().argmax(0).tolist() == [1, 2, 0]


def test_cayley_keeps_orthogonality_and_descends():
    g = torch.Generator().manual_seed(0)
    target = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))[0]
    r = torch.nn.Parameter(torch.eye(6, dtype=torch.float64))
    opt = CayleySGD([r], lr=0.1, momentum=0.5, reortho_every=0)
    losses = []
    for _ in range(60):
        loss = (r - target).square().sum()
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.testing.assert_close(r.T @ r, torch.eye(6, dtype=torch.float64), atol=1e-10, rtol=0)
    assert losses[-1] < 0.5 * losses[0]
    step = cayley_retraction(torch.eye(3, dtype=torch.float64), torch.randn(3, 3, dtype=torch.float64), 0.3)
    torch.testing.assert_close(step.T @ step, torch.eye(3, dtype=torch.float64))


def test_cayley_batched_matches_per_matrix():
    """A batch ``[H, n, n]`` of rotations (OSTQuant's per-head R_ov) steps exactly as each matrix on its own."""
    g = torch.Generator().manual_seed(1)
    r = torch.linalg.qr(torch.randn(3, 4, 4, generator=g, dtype=torch.float64))[0]
    grad = torch.randn(3, 4, 4, generator=g, dtype=torch.float64)
    out = cayley_retraction(r, grad, 0.2)
    for h in range(3):
        torch.testing.assert_close(out[h], cayley_retraction(r[h], grad[h], 0.2), atol=1e-12, rtol=0)
        torch.testing.assert_close(out[h].T @ out[h], torch.eye(4, dtype=torch.float64), atol=1e-12, rtol=0)
    p = torch.nn.Parameter(r.clone())
    opt = CayleySGD([p], lr=0.2, momentum=0.0, reortho_every=1)  # QR re-orthonormalisation on a batch
    p.grad = grad.clone()
    opt.step()
    torch.testing.assert_close(p.detach(), out, atol=1e-10, rtol=0)


def test_qsur_closed_forms_and_ordering():
    d = 4
    ball_in_cube = math.pi ** (d / 2) / math.gamma(d / 2 + 1) / 2**d
    assert qsur(torch.eye(d)).item() == pytest.approx(ball_in_cube, rel=1e-10)
    lam = torch.tensor([16.0, 4.0, 1.0, 1.0])
    # axis-aligned anisotropy: V_X shrinks by prod(sqrt(lam / lam_max)), the box is set by the largest axis
    assert qsur(torch.diag(lam)).item() == pytest.approx(ball_in_cube * float((lam / 16).sqrt().prod()), rel=1e-10)
    q = torch.linalg.qr(torch.randn(d, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))[0]
    rotated = q @ torch.diag(lam).double() @ q.T
    assert qsur(rotated, box="box") <= qsur(torch.eye(d) * 16, box="box") + 1e-12  # isotropy is the maximum
    assert log_qsur(torch.eye(d), torch.ones(d)) < log_qsur(torch.eye(d))  # a mean offset wastes grid
    with pytest.raises(ConfigError, match="box"):
        qsur(torch.eye(2), box="sphere")


def test_kl_top_definition():
    g = torch.Generator().manual_seed(0)
    zf, zq = torch.randn(3, 5, 10, generator=g), torch.randn(3, 5, 10, generator=g)
    assert kl_top(zf, zq, k=10).item() == pytest.approx(kl_full(zf, zq).item(), rel=1e-5)
    p, logq = torch.softmax(zf, -1), torch.log_softmax(zq, -1)
    idx = zf.topk(3, -1).indices
    ref = (p.gather(-1, idx) * (p.gather(-1, idx).log() - logq.gather(-1, idx))).sum(-1).mean()
    assert kl_top(zf, zq, k=3).item() == pytest.approx(ref.item(), rel=1e-5)
    assert kl_top(zf, zf, k=3).item() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ConfigError, match="k="):
        kl_top(zf, zq, k=0)


# -- signed 4-bit scale, official clip grid, centred KLT -----------------------------------------------------------
def test_signed_scale_uses_level_minus_8_on_negative_dominated_rows():
    # [-8, -4, 1, 3]: s = max(8 / 8, 3 / 7) = 1, so every entry is on the grid [-8, 7] and quantizes exactly. The old
    # absmax/7 scale (8/7) gives x/s = [-7, -3.5, 0.875, 2.625] -> [-7, -4, 1, 3] * 8/7 (coarser, -8 never used).
    neg = torch.tensor([[-8.0, -4.0, 1.0, 3.0]], dtype=torch.float64)
    assert fake_quant(neg, 4, symmetric=True).tolist() == neg.tolist()
    old = fake_quant(neg, 4, symmetric=True, sym_scale="absmax")
    torch.testing.assert_close(old, torch.tensor([[-7.0, -4.0, 1.0, 3.0]], dtype=torch.float64) * 8 / 7)
    # a positive-dominated row keeps s = max / 7 under both rules: [-2, 7, 3, 0] -> s = max(2/8, 7/7) = 1
    pos = torch.tensor([[-2.0, 7.0, 3.0, 0.0]], dtype=torch.float64)
    assert fake_quant(pos, 4, symmetric=True).tolist() == pos.tolist()
    assert fake_quant(pos, 4, symmetric=True, sym_scale="absmax").tolist() == pos.tolist()
    # RTN and GPTQ inherit it (H = I: no error propagation, GPTQ = RTN)
    assert rtn_weight(neg, 4).tolist() == neg.tolist()
    eye = torch.eye(4, dtype=torch.float64)
    assert gptq(neg, eye, 4).tolist() == neg.tolist() and gptq_naive(neg, eye, 4).tolist() == neg.tolist()
    assert not torch.equal(gptq(neg, eye, 4, sym_scale="absmax"), neg)
    with pytest.raises(ConfigError, match="sym_scale"):
        fake_quant(neg, 4, symmetric=True, sym_scale="max")


def _clip_row() -> torch.Tensor:
    # one outlier 7 and 29 entries 0.5. With ratio r < 1 (s = r): q(7) = 7r (clamped at level 7), q(0.5) = r (level 1,
    # for r in [1/3, 1)), so err_p(r) = 29 |r - 0.5|^p + (7 (1 - r))^p; r = 1 gives 29 * 0.5^p (0.5 -> level 0).
    # p = 2: minimum at r = (14.5 + 49) / 78 = 0.814; err(0.81) = 4.5558 < err(0.82) = 4.5572 < err(0.80) = 4.57.
    return torch.tensor([[7.0] + [0.5] * 29], dtype=torch.float64)


def test_clip_search_official_grid_and_exponent():
    assert len(clip_ratios("official")) == 80 and clip_ratios("official")[0] == 1.0
    assert clip_ratios("official")[-1] == pytest.approx(0.21) and clip_ratios("official")[1] == pytest.approx(0.99)
    assert clip_ratios("coarse") == pytest.approx([1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5])
    w = _clip_row()
    expected = torch.full_like(w, 0.81)  # level 1 of s = 0.81 for the 0.5s, level 7 for the outlier
    expected[0, 0] = 7 * 0.81
    torch.testing.assert_close(rtn_weight(w, 4, clip_search=True, clip_norm=2.0), expected, rtol=0, atol=1e-12)
    coarse = rtn_weight(w, 4, clip_search=True, clip_grid="coarse", clip_norm=2.0)  # 0.81 is not on it: 0.80 wins
    torch.testing.assert_close(coarse, expected / 0.81 * 0.80, rtol=0, atol=1e-12)
    # p = 2.4 (official default): the argmin of the closed form above over the official grid
    grid = torch.tensor(clip_ratios("official")[1:], dtype=torch.float64)
    err = 29 * (grid - 0.5).abs() ** 2.4 + (7 * (1 - grid)) ** 2.4
    r = float(grid[err.argmin()])
    assert r != pytest.approx(0.81)  # the exponent changes the choice
    torch.testing.assert_close(rtn_weight(w, 4, clip_search=True), expected / 0.81 * r, rtol=0, atol=1e-12)
    # GPTQ (fast and naive) searches the same way when it computes a row's scale
    eye = torch.eye(30, dtype=torch.float64)
    for fn in (gptq, gptq_naive):
        torch.testing.assert_close(fn(w, eye, 4, clip_search=True, clip_norm=2.0), expected, rtol=0, atol=1e-12)
        assert fn(w, eye, 4).tolist() == fake_quant(w, 4, symmetric=True).tolist()  # off: no clipping
    with pytest.raises(ConfigError, match="clip_grid"):
        rtn_weight(w, 4, clip_search=True, clip_grid="fine")


def test_weight_klt_uses_centred_covariance():
    # rows (10, 0), (12, 0), (11, 3), (11, -3): mean (11, 0), centred covariance diag(0.5, 4.5) -> first axis e2;
    # the uncentred W^T W / N = diag(121.5, 4.5) would pick e1 (the mean direction).
    rows = torch.tensor([[10.0, 0.0], [12.0, 0.0], [11.0, 3.0], [11.0, -3.0]], dtype=torch.float64)
    torch.testing.assert_close(row_covariance(rows), torch.diag(torch.tensor([0.5, 4.5], dtype=torch.float64)))
    assert weight_klt(rows).abs().tolist() == [[0.0, 1.0], [1.0, 0.0]]
    assert weight_klt(rows, centered=False).abs().tolist() == [[1.0, 0.0], [0.0, 1.0]]
    batched = weight_klt(torch.stack([rows, rows.flip(-1)]))  # [H, N, n] -> [H, n, n]
    assert batched[1].abs().tolist() == [[1.0, 0.0], [0.0, 1.0]]


def test_qsur_vertex_range_hand_computed():
    """d = 1, N(mu, lambda), phi = 1: V_X = 2 sqrt(lambda), vertices mu +- sqrt(lambda). ``vertex_range`` side
    2 sqrt(lambda) -> QSUR 1; ``vertices`` side 2 (|mu| + sqrt(lambda)) -> sqrt(lambda) / (|mu| + sqrt(lambda))."""
    cov, mean = torch.tensor([[4.0]]), torch.tensor([3.0])
    assert qsur(cov, mean, box="vertex_range").item() == pytest.approx(1.0, rel=1e-12)
    assert qsur(cov, mean, box="vertices").item() == pytest.approx(2 / 5, rel=1e-12)
    c = torch.diag(torch.tensor([4.0, 1.0, 0.25]))  # mu = 0: the vertex forms agree
    assert qsur(c, box="vertex_range").item() == pytest.approx(qsur(c, box="vertices").item(), rel=1e-12)
