"""PreWorld ops: every vectorised path against its loop twin in float64 (outputs and gradients)."""

from __future__ import annotations

import math

import pytest
import torch

from ops.occupancy import losses as L
from ops.occupancy import naive as N
from ops.occupancy import render as R
from ops.occupancy.pool import voxel_pool

PC = (-4.0, -4.0, -1.0, 4.0, 4.0, 1.0)


@pytest.fixture(autouse=True)
def float64():
    """Parity in float64; restored afterwards so other test modules keep float32."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _grads(f, *xs):
    xs = [x.detach().clone().requires_grad_(True) for x in xs]
    out = f(*xs)
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(1))).sum().backward()
    return out.detach(), [x.grad for x in xs]


def test_contract_matches_loop_and_is_bounded():
    p = torch.randn(50, 3, generator=torch.Generator().manual_seed(0)) * 3
    q = R.contract(p, 0.2)
    assert torch.allclose(q, N.naive_contract(p, 0.2), atol=1e-12)
    assert q.norm(dim=-1).max() < 1.2
    inner = p.norm(dim=-1) <= 1
    assert torch.equal(q[inner], p[inner])


def test_ray_distances_inner_then_outer():
    t = R.ray_distances(30)
    assert t.numel() == 30 + 2 and math.isclose(float(t[0]), 1 / 30) and math.isclose(float(t[29]), 2.0 - 1 / 30)
    assert (t[1:] > t[:-1]).all() and 2.0 < float(t[-1]) < 128.0


def test_raw2alpha_and_weights_match_loops_with_grads():
    g = torch.Generator().manual_seed(0)
    sigma = torch.randn(6, 9, generator=g) * 3
    a, (ga,) = _grads(lambda s: R.raw2alpha(s, R.ALPHA_INIT_SHIFT, 0.5), sigma)
    b, (gb,) = _grads(lambda s: N.naive_raw2alpha(s, R.ALPHA_INIT_SHIFT, 0.5), sigma)
    assert torch.allclose(a, b, atol=1e-12) and torch.allclose(ga, gb, atol=1e-10)
    alpha = torch.rand(5, 8, generator=g)
    for thr in (0.0, 0.05):
        (w1, t1), (w2, t2) = R.alphas_to_weights(alpha, thr), N.naive_alphas_to_weights(alpha, thr)
        assert torch.allclose(w1, w2, atol=1e-12) and torch.allclose(t1, t2, atol=1e-12)
    w, t = R.alphas_to_weights(alpha)
    assert torch.allclose(w.sum(-1) + t, torch.ones(5), atol=1e-12)  # weights + background transmittance = 1
    f1 = lambda a: torch.cat([x.reshape(-1) for x in R.alphas_to_weights(a)])  # noqa: E731
    f2 = lambda a: torch.cat([x.reshape(-1) for x in N.naive_alphas_to_weights(a)])  # noqa: E731
    _, (g1,) = _grads(f1, alpha)
    _, (g2,) = _grads(f2, alpha)
    assert torch.allclose(g1, g2, atol=1e-10)


def test_trilinear_sample_matches_loop_with_grads():
    g = torch.Generator().manual_seed(0)
    vol = torch.randn(2, 3, 4, 5, 3, generator=g)
    pts = (torch.rand(2, 7, 3, generator=g) * 1.2 - 0.1) * torch.tensor([8.0, 8.0, 2.0]) + torch.tensor(PC[:3])
    a, (ga, gpa) = _grads(lambda v, p: R.sample_volume(v, p, PC), vol, pts)
    b, (gb, gpb) = _grads(lambda v, p: N.naive_trilinear(v, p, PC), vol, pts)
    assert torch.allclose(a, b, atol=1e-12)
    assert torch.allclose(ga, gb, atol=1e-10) and torch.allclose(gpa, gpb, atol=1e-9)


def test_render_values_and_depth():
    g = torch.Generator().manual_seed(0)
    w, v = torch.rand(4, 6, generator=g), torch.randn(4, 6, 3, generator=g)
    a, (ga, gv) = _grads(R.render_values, w, v)
    b, (gb, gw) = _grads(N.naive_render, w, v)
    assert torch.allclose(a, b, atol=1e-12) and torch.allclose(ga, gb) and torch.allclose(gv, gw)
    d = torch.rand(4, 6, generator=g) * 10
    assert torch.allclose(R.render_depth(w, d), N.naive_render(w, d[..., None])[:, 0], atol=1e-12)


def test_render_rays_opaque_wall_depth():
    """An opaque slab at x in [2, 4] seen from the origin along +x: depth ~ 2 (trilinear blur)."""
    vol = torch.full((1, 1 + 2 + 3, 16, 4, 4), -30.0)
    vol[:, 0, 12:] = 30.0
    o = torch.zeros(1, 1, 3)
    d = torch.tensor([[[1.0, 0.0, 0.0]]])
    out = R.render_rays(vol, o, d, PC, (0.0, 0.0, 0.0), 4.0, bg_len=0.2, n_inner=400, interval=2.0)
    assert abs(float(out["depth"]) - 2.0) < 0.25 and float(out["t_last"]) < 1e-6


def test_distortion_o_n_matches_o_n2_with_grads():
    g = torch.Generator().manual_seed(0)
    w = torch.rand(3, 7, generator=g) / 7
    s = torch.sort(torch.rand(7, generator=g)).values
    iv = torch.rand(7, generator=g) * 0.1
    a, (ga,) = _grads(lambda w: L.distortion_loss(w, s, iv), w)
    b, (gb,) = _grads(lambda w: N.naive_distortion(w, s, iv), w)
    assert torch.allclose(a, b, atol=1e-12) and torch.allclose(ga, gb, atol=1e-12)


def test_silog_ce_l1_entropy_values():
    est, gt = torch.tensor([2.0, 4.0]), torch.tensor([1.0, 2.0])
    assert math.isclose(float(L.silog(est, gt)), math.sqrt(math.log(2) ** 2 * 0.15), rel_tol=1e-9)
    assert float(L.silog(gt * 3, gt, lam=1.0)) < 1e-5  # lam = 1: fully scale invariant
    w = L.class_weights(torch.tensor([1e6, 1e2]))
    assert math.isclose(float(w[0]), 1 / math.log(1e6 + 1e-3)) and w[1] > w[0]
    assert math.isclose(float(L.l1_color(torch.zeros(2, 3), torch.ones(2, 3))), 3.0)
    assert math.isclose(float(L.background_entropy(torch.tensor([0.5]))), math.log(2), rel_tol=1e-9)
    assert float(L.background_entropy(torch.tensor([0.0, 1.0]))) < 1e-4


def test_focal_ce_reduces_to_weighted_ce_at_gamma_0_and_loop():
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(20, 4, generator=g), torch.randint(0, 4, (20,), generator=g)
    y[3] = 255
    wt = torch.tensor([1.0, 2.0, 0.5, 3.0])
    assert torch.allclose(L.focal_ce(logits, y, wt, gamma=0.0), L.weighted_ce(logits, y, wt))
    p = torch.softmax(logits, -1)
    ref = sum(-wt[c] * (1 - p[i, c]) ** 2 * torch.log(p[i, c]) for i, c in enumerate(y.tolist()) if c != 255)
    assert torch.allclose(L.focal_ce(logits, y, wt), ref / sum(wt[c] for c in y.tolist() if c != 255))


def test_sem_scal_geo_scal_lovasz_match_loops_with_grads():
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(30, 4, generator=g), torch.randint(0, 3, (30,), generator=g)  # class 3 absent
    a, (ga,) = _grads(lambda z: L.sem_scal(z, y)[None], logits)
    b, (gb,) = _grads(lambda z: N.naive_sem_scal(z, y)[None], logits)
    assert torch.allclose(a, b, atol=1e-12) and torch.allclose(ga, gb, atol=1e-10)
    # geo_scal is sem_scal of the 2-class occupied/empty problem's "occupied" class
    empty = 3
    p_occ = 1 - torch.softmax(logits, -1)[:, empty]
    two = torch.stack([torch.log(1 - p_occ), torch.log(p_occ)], -1)
    yb = (y != empty).long()
    geo_ref = N.naive_sem_scal(two, yb) * 2 - N.naive_sem_scal(two[yb == 1], yb[yb == 1])  # only class 1 terms
    assert float(L.geo_scal(logits, y, empty)) > 0 and torch.isfinite(geo_ref)
    for c in range(3):
        fg = (y == c).double()
        err = (fg - torch.softmax(logits, -1)[:, c]).abs()
        es, perm = torch.sort(err, descending=True)
        assert torch.allclose(torch.dot(es, L.lovasz_grad(fg[perm])), N.naive_lovasz_class(err, fg), atol=1e-12)
    perfect = torch.nn.functional.one_hot(y, 4).double() * 50
    assert float(L.lovasz_softmax(perfect, y)) < 1e-10 and float(L.lovasz_softmax(logits, y)) > 0.1


def test_geo_scal_is_zero_for_a_perfect_prediction():
    y = torch.tensor([0, 1, 3, 3, 2])
    perfect = torch.nn.functional.one_hot(y, 4).double() * 50
    assert float(L.geo_scal(perfect, y, empty_class=3)) < 1e-6
    assert float(L.geo_scal(-perfect, y, empty_class=3)) > 1.0


@pytest.mark.parametrize("b", [1, 2])
def test_voxel_pool_matches_loop_with_grads(b):
    g = torch.Generator().manual_seed(b)
    depth = torch.softmax(torch.randn(b, 2, 3, 2, 3, generator=g), dim=2)
    ctx = torch.randn(b, 2, 4, 2, 3, generator=g)
    pts = (torch.rand(b, 2, 3, 2, 3, 3, generator=g) * 1.4 - 0.2) * torch.tensor([8.0, 8.0, 2.0]) + torch.tensor(PC[:3])
    a, (ga, gc) = _grads(lambda d, c: voxel_pool(d, c, pts, PC, (4, 4, 2)), depth, ctx)
    n, (na, nc) = _grads(lambda d, c: N.naive_voxel_pool(d, c, pts, PC, (4, 4, 2)), depth, ctx)
    assert torch.allclose(a, n, atol=1e-12) and torch.allclose(ga, na) and torch.allclose(gc, nc)
    assert a.abs().sum() > 0
