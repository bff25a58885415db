"""Protocol metrics (by hand), N-ForGOT losses vs their loop twins (values, gradients, float64), temporal WL."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from layers.temporal_graph.sampler import TemporalNeighborSampler, naive_temporal_neighbors
from ops.continual.metrics import average_forgetting, average_performance, backward_transfer
from ops.nforgot.losses import (
    kd_loss,
    linear_time_mmd,
    multi_kernel_mmd,
    prototype_distance_loss,
    wl_histogram_mmd,
    wl_kernel_mmd,
)
from ops.nforgot.naive import (
    naive_kd_loss,
    naive_linear_time_mmd,
    naive_prototype_distance_loss,
    naive_wl_kernel_mmd,
)
from ops.nforgot.wl import naive_temporal_wl_labels, temporal_wl_labels

# acc[j][i]: accuracy on task j after task i (upper triangle unused)
ACC = [[0.9, 0.6, 0.5], [0.0, 0.8, 0.9], [0.0, 0.0, 0.7]]


def test_ap_af_bwt_by_hand():
    np.testing.assert_allclose(average_performance(ACC), [0.9, (0.6 + 0.8) / 2, (0.5 + 0.9 + 0.7) / 3])
    # AF_1 = max(0.9-0.6, 0) = 0.3; AF_2 = (max(0.9-0.5,0) + max(0.8-0.9,0)) / 2 = 0.2
    np.testing.assert_allclose(average_forgetting(ACC), [0.3, 0.2])
    # BWT_1 = 0.6-0.9; BWT_2 = ((0.5-0.9) + (0.9-0.8)) / 2 = -0.15
    np.testing.assert_allclose(backward_transfer(ACC), [-0.3, -0.15])
    with pytest.raises(ValueError, match="square"):
        average_performance([[1.0, 2.0]])


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).requires_grad_()


def grads(fn, *xs):
    out = fn(*xs)
    return out, torch.autograd.grad(out, xs)


def test_kd_loss_parity_and_value():
    z, z0 = rand(6, 4), rand(6, 4, seed=1).detach()
    a, ga = grads(lambda z: kd_loss(z, z0, 2.0), z)
    b, gb = grads(lambda z: naive_kd_loss(z, z0, 2.0), z)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-12)
    # equal logits: cross-entropy of a distribution with itself = its entropy; uniform -> log C
    assert math.isclose(float(kd_loss(torch.zeros(2, 4), torch.zeros(2, 4))), math.log(4), rel_tol=1e-6)


def test_prototype_distance_loss_parity_and_hand_value():
    emb, emb0 = rand(10, 3), rand(10, 3, seed=1).detach()
    labels = torch.tensor([4, 5, 4, 4, 5, 5, 4, 5, 5, 4])
    protos = rand(3, 3, seed=2).detach()
    a, ga = grads(lambda e: prototype_distance_loss(e, emb0, labels, protos), emb)
    b, gb = grads(lambda e: naive_prototype_distance_loss(e, emb0, labels, protos), emb)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ga, gb, rtol=1e-10, atol=1e-12)
    # one class, one prototype at the origin: p = 1, p0 = 2 (1-D) -> |1 - 4| = 3
    one = torch.tensor([[1.0]])
    assert float(prototype_distance_loss(one, 2 * one, torch.tensor([0]), torch.zeros(1, 1))) == 3.0


def test_linear_time_mmd_parity_grads_and_behaviour():
    x, y = rand(9, 4, 3), rand(9, 4, 3, seed=1)  # [B, n+1, D] subtrees; odd B drops the last one
    a, ga = grads(linear_time_mmd, x, y)
    b, gb = grads(lambda x, y: naive_linear_time_mmd(x.flatten(1), y.flatten(1)), x, y)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for u, v in zip(ga, gb):
        torch.testing.assert_close(u, v, rtol=1e-10, atol=1e-12)
    same = linear_time_mmd(x.detach(), x.detach())
    assert float(same) == pytest.approx(0.0, abs=1e-12)  # h_i = k(x,x') + k(x,x') - 2 k(x,x') = 0
    far = linear_time_mmd(x.detach(), x.detach() + 100.0)
    assert float(far) > 1.0  # distant samples: cross kernels vanish


@pytest.mark.parametrize("labelled", [False, True])
def test_multi_kernel_and_wl_kernel_mmd_parity(labelled):
    x, y = rand(5, 2, 3), rand(4, 2, 3, seed=1)
    lx, ly = torch.tensor([0, 1, 1, 2, 0]), torch.tensor([1, 0, 3, 1])
    if labelled:
        a, ga = grads(lambda x, y: wl_kernel_mmd(x, y, lx, ly), x, y)
        b, gb = grads(lambda x, y: naive_wl_kernel_mmd(x, y, lx.tolist(), ly.tolist()), x, y)
    else:
        a, ga = grads(multi_kernel_mmd, x, y)
        b, gb = grads(naive_wl_kernel_mmd, x, y)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for u, v in zip(ga, gb):
        torch.testing.assert_close(u, v, rtol=1e-8, atol=1e-10)


def test_wl_histogram_mmd_by_hand():
    lx, ly = torch.tensor([0, 0, 1, 2]), torch.tensor([0, 1, 1, 1, 3])
    hist = float(wl_histogram_mmd(lx, ly))
    # by hand: p_x = (1/2, 1/4, 1/4, 0), p_y = (1/5, 3/5, 0, 1/5)
    assert hist == pytest.approx((0.5 - 0.2) ** 2 + (0.25 - 0.6) ** 2 + 0.25**2 + 0.2**2)


def test_wl_kernel_mmd_only_compares_equal_patterns():
    # every subtree its own pattern: only the diagonal survives, each term = 5 kernels x exp(0) = 5
    x, y = rand(4, 3), rand(5, 3, seed=1)
    val = wl_kernel_mmd(x, y, torch.arange(10, 14), torch.arange(20, 25))
    assert float(val) == pytest.approx(5 * 4 / 16 + 5 * 5 / 25, rel=1e-12)
    (gx,) = torch.autograd.grad(val, x)
    assert float(gx.abs().max()) == 0.0  # no pair of equal patterns -> nothing to pull together
    val2 = wl_kernel_mmd(x, y, torch.tensor([1, 10, 11, 12]), torch.tensor([1, 20, 21, 22, 23]))
    (gx2,) = torch.autograd.grad(val2, x)
    assert float(gx2[0].abs().max()) > 0 and float(gx2[1:].abs().max()) == 0.0


def test_temporal_wl_fast_labels_partition_like_the_exact_nested_tuples():
    g = torch.Generator().manual_seed(0)
    n, e = 14, 90
    src, dst = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    t = torch.randint(0, 30, (e,), generator=g).double()
    s = TemporalNeighborSampler(n, src, dst, t)
    qn, qt = torch.randint(0, n, (40,), generator=g), torch.randint(0, 32, (40,), generator=g).double()

    def nbrs(u, tq, k):
        r = naive_temporal_neighbors(n, src, dst, t, torch.tensor([u]), torch.tensor([tq]), k)
        return [(int(r.nodes[0, j]), float(r.times[0, j])) for j in range(k) if r.mask[0, j]]

    def count(u, tq):
        return int(((src == u) & (t < tq)).sum() + ((dst == u) & (t < tq)).sum())

    for h, k in [(1, 3), (2, 3)]:
        fast = temporal_wl_labels(s, qn, qt, k, h, time_scale=2.0, time_buckets=4)
        exact = naive_temporal_wl_labels(nbrs, count, qn.tolist(), qt.tolist(), k, h, time_scale=2.0, time_buckets=4)
        same_fast = fast.unsqueeze(0) == fast.unsqueeze(1)
        same_exact = torch.tensor([[a == b for b in exact] for a in exact])
        assert torch.equal(same_fast, same_exact)
        assert 1 < len(set(map(repr, exact))) < 40  # neither all-equal nor all-distinct: the test has teeth
