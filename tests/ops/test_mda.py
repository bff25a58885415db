"""MDA's pieces on a deterministic mock model (a linear scorer over patch means, float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from core.errors import ConfigError
from ops.attribution import mda as A
from ops.attribution.projection import second_difference

GEN = torch.Generator().manual_seed(0)
W = torch.randn(3, 16, generator=GEN, dtype=torch.float64) * 4.0


def linear_model(x: torch.Tensor) -> torch.Tensor:
    """Class logits = W @ (2x2 patch means of an 8x8 grey image): a smooth, deterministic classifier."""
    pooled = F.avg_pool2d(x.double(), 2).reshape(len(x), -1)
    return torch.softmax(pooled @ W.T, dim=1)


IMG = torch.rand(1, 8, 8, generator=GEN, dtype=torch.float64)
GRID = torch.arange(16).reshape(4, 4).repeat_interleave(2, 0).repeat_interleave(2, 1)  # the 2x2-patch grid


def test_window_size_matches_official():
    assert A.window_size(49) == 14 and A.window_size(196) == 28 and A.window_size(16) == 8 and A.window_size(50) == 14


def test_slic_is_a_near_grid_and_bad_counts_fail():
    img = torch.rand(1, 28, 28, generator=torch.Generator().manual_seed(1))
    seg = A.slic_segments(img, 49)
    assert int(seg.max()) + 1 == 49
    sizes = torch.bincount(seg.reshape(-1))
    assert int(sizes.min()) >= 9 and int(sizes.max()) <= 25  # 16 px each on the exact grid
    with pytest.raises(ConfigError, match="does not fit"):
        A.slic_segments(img, 28 * 28 + 1)
    with pytest.raises(ConfigError, match="perfect square"):
        A.slic_segments(img, 50)


def test_prior_per_segment_pools_on_the_grid():
    prior = torch.zeros(8, 8, dtype=torch.float64)
    prior[:2, :2] = 4.0  # one 2x2 patch
    got = A.prior_per_segment(prior, GRID, 16)
    want = torch.zeros(16, dtype=torch.float64)
    want[0] = 4.0
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("maximize", [True, False])
def test_batched_search_matches_one_by_one(maximize: bool):
    order = torch.randperm(16, generator=torch.Generator().manual_seed(2)).tolist()
    start, finish = torch.zeros_like(IMG), IMG
    fast, img_f = A.greedy_patch_order(linear_model, start, finish, GRID, order, 8, maximize, 0)
    slow, img_s = A.greedy_patch_order_naive(linear_model, start, finish, GRID, order, 8, maximize, 0)
    assert fast.order == slow.order and sorted(fast.order) == list(range(16))
    np.testing.assert_allclose(fast.responses, slow.responses, rtol=0, atol=1e-13)
    torch.testing.assert_close(img_f, img_s, rtol=0, atol=0)
    torch.testing.assert_close(img_f, IMG)  # every segment pasted in the end


def test_greedy_step_is_the_window_argmax_by_brute_force():
    order = list(range(16))
    res, _ = A.greedy_patch_order(linear_model, torch.zeros_like(IMG), IMG, GRID, order, 4, True, 1, n_steps=1)
    cands = []
    for s in range(4):  # the window holds the first 4 unchosen segments of the order
        x = torch.zeros_like(IMG)
        sel = GRID.eq(s)
        x[:, sel] = IMG[:, sel]
        cands.append(float(linear_model(x[None])[0, 1]))
    assert res.order == [int(np.argmax(cands))] and res.responses[0] == pytest.approx(max(cands), abs=1e-14)


def test_early_stop_records_the_phase():
    order = list(range(16))
    zero = torch.zeros_like(IMG)
    res, _ = A.greedy_patch_order(linear_model, zero, IMG, GRID, order, 8, True, 0, stop=lambda p: True)
    assert res.stopped_at == 0 and res.phase2_step is None and len(res.order) == 1
    calls = iter(range(100))
    res2, _ = A.greedy_patch_order(
        linear_model, torch.zeros_like(IMG), IMG, GRID, order, 8, True, 0, stop=lambda p: next(calls) == 10
    )
    assert res2.stopped_at == 10 and res2.phase2_step == 2  # phase 1 covers P - w = 8 steps


def test_magnitudes_and_dense_by_hand():
    order = [2, 0, 1]  # deletion order over P = 3 segments
    curve = np.array([1.0, 0.4, 0.1, 0.0])
    sizes = torch.tensor([2, 4, 1])
    a = A.magnitudes_from_curve(order, curve, sizes)
    # i=1 -> seg 2: 0.6/1 + 0.6*2/3; i=2 -> seg 0: 0.3/2 + 0.3/3; i=3 -> seg 1: 0.1/4 + 0
    torch.testing.assert_close(a, torch.tensor([0.15 + 0.1, 0.025, 0.6 + 0.4], dtype=torch.float64))
    d = A.dense_scores(order, a, kappa=0.2)
    # >= kappa: seg 2 -> 2/3, seg 0 -> 1/3; seg 1 keeps 0.025; then rescaled to the sparse max 1.0
    torch.testing.assert_close(d, torch.tensor([1 / 3, 0.025, 2 / 3], dtype=torch.float64) * 1.5)
    with pytest.raises(ConfigError, match="P \\+ 1"):
        A.magnitudes_from_curve(order, curve[:3], sizes)


def _run(**kw):
    prior = torch.rand(8, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    args = dict(blur_klen=(3, 2, 7), blur_max_conf=1.0, segments=GRID)
    args.update(kw)
    return A.mda(linear_model, IMG, prior, 16, **args)


def test_mda_end_to_end_on_the_mock():
    res = _run()
    assert sorted(res.deletion_order) == list(range(16))
    assert set(res.insertion_prefix) <= set(res.deletion_order)
    assert res.deletion_order[: len(res.insertion_prefix)] == res.insertion_prefix  # prefix deleted first
    for curve in (res.curve_first, res.curve_rescored):
        assert len(curve) == 17 and (second_difference(17) @ curve).min() >= -1e-8
    for g in (0.0, 0.5, 1.0):
        assert res.maps[g].shape == (8, 8) and bool(torch.isfinite(res.maps[g]).all())
        assert float(res.maps[g].max()) == pytest.approx(float(res.maps[0.0].max()))  # dense rescaled to sparse max
    torch.testing.assert_close(res.maps[0.5], 0.5 * (res.maps[0.0] + res.maps[1.0]))
    # forward budget: roughly P x w for the two searches plus the MAS re-scoring
    assert 16 < res.forward_images < 16 * 8 * 2 + 64
    slow = _run(batched=False)
    assert slow.deletion_order == res.deletion_order
    torch.testing.assert_close(slow.maps[0.0], res.maps[0.0])


def test_mda_official_quirks_and_cutoff_edges():
    paper, official = _run(), _run(official_quirks=True)
    assert sorted(official.deletion_order) == list(range(16))
    assert _run(cutoff=0.0).insertion_prefix == []
    assert len(_run(cutoff=1.0).insertion_prefix) == 16  # tau = 1 disables the early exit (official)
    assert paper.maps[0.0].shape == official.maps[0.0].shape


def test_mda_bad_inputs():
    with pytest.raises(ConfigError, match="prior saliency map has shape"):
        A.mda(linear_model, IMG, torch.zeros(4, 4), 16, blur_max_conf=1.0, blur_klen=(3, 2, 7))
    with pytest.raises(ConfigError, match="cutoff"):
        _run(cutoff=1.5)
    assert _run(blur_max_conf=0.0) is None  # blur never gets below 0% confidence: image skipped


def test_official_prefix_quirk_by_hand():
    # phase 1 exit at step 2: the cutoff is written at index 2; raw 0.95 at index 1 is the first value >= 0.9
    res = A.SearchResult(order=[5, 6, 7], responses=[0.5, 0.95, 0.7], stopped_at=2, phase2_step=None)
    assert A._insertion_prefix(res, 16, 8, 0.9, 0.0, 1.0, official_quirks=False) == [5, 6, 7]
    assert A._insertion_prefix(res, 16, 8, 0.9, 0.0, 1.0, official_quirks=True) == [5, 6]
    # phase 2 exit at global step 9 (step 1 of the shrinking phase): the cutoff lands at index 1, not 9
    res2 = A.SearchResult(order=list(range(10)), responses=[0.1] * 9 + [0.8], stopped_at=9, phase2_step=1)
    assert A._insertion_prefix(res2, 16, 8, 0.9, 0.0, 1.0, official_quirks=True) == [0, 1]


def test_batched_search_matches_one_by_one_on_a_vit_with_irregular_segments():
    """The fast path (one buffer, one indexed write, inference mode) on a float64 ViT, uneven segment sizes."""
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(
        img_size=8, patch_size=2, in_chans=1, num_classes=3, embed_dim=16, depth=1, num_heads=2, mlp_ratio=2.0
    ).double()
    vit.eval()

    def fn(x):
        with torch.no_grad():
            return torch.softmax(vit(x), 1)

    seg = GRID.clone()
    seg[0, :] = 3  # segment 3 grows, segments 0 and 1 shrink: sizes differ
    blurred = A.calibrate_blur(fn, IMG, 1, 3, 2, 3, max_conf=1.0)[0]
    for maximize, start in ((True, blurred), (False, torch.zeros_like(IMG))):
        order = torch.randperm(16, generator=torch.Generator().manual_seed(3)).tolist()
        fast, img_f = A.greedy_patch_order(fn, start, IMG, seg, order, 5, maximize, 1)
        slow, img_s = A.greedy_patch_order_naive(fn, start, IMG, seg, order, 5, maximize, 1)
        assert fast.order == slow.order
        np.testing.assert_allclose(fast.responses, slow.responses, rtol=0, atol=1e-12)
        torch.testing.assert_close(img_f, img_s, rtol=0, atol=0)
        assert not img_f.is_inference()  # usable outside inference mode
    pixels = A.segment_pixels(seg)
    assert [len(p) for p in pixels] == torch.bincount(seg.reshape(-1)).tolist()
    assert all(bool((seg.reshape(-1)[p] == i).all()) for i, p in enumerate(pixels))
