"""Attribution baselines on a tiny float64 timm ViT, each against its defining equation.

The oracle is an explicit forward pass written from the block weights (attention matrices as plain autograd
tensors), independent of the hooks the baselines use.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from core.errors import ConfigError
from lightning_modules.mda import baselines as B
from lightning_modules.mda import lrp as L


@pytest.fixture(scope="module")
def vit():
    torch.manual_seed(0)
    m = VisionTransformer(
        img_size=8, patch_size=2, in_chans=1, num_classes=3, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0
    )
    return m.double().eval()


X = torch.rand(1, 1, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def manual(model, x):
    """Logits and the attention matrices [heads, N, N] (retain_grad), block by block."""
    t = model._pos_embed(model.patch_embed(x))
    attns = []
    for blk in model.blocks:
        h = blk.norm1(t)
        b, n, d = h.shape
        nh = blk.attn.num_heads
        qkv = blk.attn.qkv(h).reshape(b, n, 3, nh, d // nh).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        a = torch.softmax(q @ k.transpose(-2, -1) * blk.attn.scale, -1)
        a.retain_grad()
        attns.append(a)
        o = (a @ v).transpose(1, 2).reshape(b, n, d)
        t = t + blk.attn.proj(o)
        t = t + blk.mlp(blk.norm2(t))
    t = model.norm(t)
    return model.head(t[:, 0]), attns


def up(tok):
    return F.interpolate(tok.reshape(1, 1, 4, 4), size=(8, 8), mode="bilinear", align_corners=False)[0, 0]


def test_manual_forward_matches_timm(vit):
    logits, _ = manual(vit, X)
    torch.testing.assert_close(logits, vit(X))


def _grads(vit, target):
    vit.zero_grad()
    logits, attns = manual(vit, X)
    logits[0, target].backward()
    return [a[0].detach() for a in attns], [a.grad[0] for a in attns]


def test_rollout_equation(vit):
    _, attns = manual(vit, X)
    r = torch.eye(17, dtype=torch.float64)
    for a in attns:
        t = 0.5 * a[0].mean(0) + 0.5 * torch.eye(17, dtype=torch.float64)
        r = (t / t.sum(-1, keepdim=True)) @ r
    torch.testing.assert_close(B.rollout(vit, X), up(r[0, 1:].detach()))


def test_gradcam_attn_equation(vit):
    a, g = _grads(vit, 2)
    w = g[-1][:, 0, 1:].mean(-1, keepdim=True)
    want = (w * a[-1][:, 0, 1:]).mean(0).clamp_min(0)
    torch.testing.assert_close(B.gradcam_attn(vit, X, 2), up(want))


def _simple(fn, inputs, r):
    """LRP's gradient-times-input rule, written with autograd: ``x_i ⊙ d(fn)/dx_i · (r / fn(x))`` per input."""
    xs = [t.detach().requires_grad_(True) for t in inputs]
    z = fn(*xs)
    grads = torch.autograd.grad(z, xs, L.safe_divide(r, z))
    return [x.detach() * g for x, g in zip(xs, grads)]


def _alpha1(x, w, r):
    """The alpha=1, beta=0 rule by autograd: positive and negative parts of x and W as two linear maps."""
    xp, xn = x.clamp(min=0).requires_grad_(True), x.clamp(max=0).requires_grad_(True)
    z1, z2 = xp @ w.clamp(min=0).T, xn @ w.clamp(max=0).T
    s = L.safe_divide(r, z1 + z2)
    g1, g2 = torch.autograd.grad([z1, z2], [xp, xn], [s, s])
    return (xp * g1 + xn * g2).detach()


def test_lrp_rules_match_their_definitions():
    g = torch.Generator().manual_seed(0)
    x, w, r = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((3, 5), (4, 5), (3, 4)))
    torch.testing.assert_close(L.lrp_linear(x, w, r), _alpha1(x, w, r))
    # eq. 3 written as a double sum
    pos = x.clamp(min=0)[:, None, :] * w.clamp(min=0)[None] + x.clamp(max=0)[:, None, :] * w.clamp(max=0)[None]
    torch.testing.assert_close(L.lrp_linear(x, w, r), (pos / pos.sum(-1, keepdim=True) * r[..., None]).sum(1))
    torch.testing.assert_close(L.lrp_linear(x, w, r).sum(), r.sum())  # conserved (no bias)
    u, v, rm = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((2, 3, 4), (2, 4, 3), (2, 3, 3)))
    ru, rv = L.lrp_matmul(u, v, rm)
    want = _simple(lambda a, b: a @ b, [u, v], rm)
    torch.testing.assert_close(ru, want[0] / 2)
    torch.testing.assert_close(rv, want[1] / 2)
    torch.testing.assert_close(ru.sum() + rv.sum(), rm.sum())
    a, b = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    ra, rb = L.lrp_add(a, b, r)
    sa, sb = _simple(lambda p, q: p + q, [a, b], r)
    fa, fb = sa.sum().abs() / (sa.sum().abs() + sb.sum().abs()), sb.sum().abs() / (sa.sum().abs() + sb.sum().abs())
    torch.testing.assert_close(ra, sa * fa * r.sum() / sa.sum())
    torch.testing.assert_close(rb, sb * fb * r.sum() / sb.sum())
    torch.testing.assert_close(ra.sum() + rb.sum(), r.sum())


def test_transformer_attribution_equation(vit):
    """Chefer 2021a: LRP relevances of the attention maps replayed through the explicit forward pass by autograd
    rules, then prod_b (I + mean_h((dA ⊙ R_A)^+))."""
    t0 = vit._pos_embed(vit.patch_embed(X))
    tapes, t = [], t0
    for blk in vit.blocks:  # the explicit forward of `manual`, keeping every intermediate
        h = blk.norm1(t)
        nh = blk.attn.num_heads
        qkv = blk.attn.qkv(h).reshape(1, 17, 3, nh, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        a = torch.softmax(q @ k.transpose(-2, -1) * blk.attn.scale, -1)
        o = (a @ v).transpose(1, 2).reshape(1, 17, -1)
        ao = blk.attn.proj(o)
        t1 = t + ao
        h2 = blk.norm2(t1)
        gl = blk.mlp.act(blk.mlp.fc1(h2))
        mo = blk.mlp.fc2(gl)
        tapes.append(dict(t=t, h=h, q=q, k=k, v=v, a=a, o=o, ao=ao, t1=t1, h2=h2, g=gl, mo=mo))
        t = t1 + mo
    pooled = vit.norm(t)[:, 0]
    r = torch.zeros(1, 17, 16, dtype=torch.float64)
    r[:, 0] = _alpha1(pooled.detach(), vit.head.weight.detach(), torch.eye(3, dtype=torch.float64)[1:2])
    rel = []
    for blk, tp in zip(reversed(vit.blocks), reversed(tapes)):
        tp = {kk: vv.detach() for kk, vv in tp.items()}
        r1, r2 = _simple(lambda p, q: p + q, [tp["t1"], tp["mo"]], r)
        f1 = r1.sum().abs() / (r1.sum().abs() + r2.sum().abs()) * r.sum()
        r1, r2 = r1 * f1 / r1.sum(), r2 * (r.sum() - f1) / r2.sum()
        w = lambda m: m.weight.detach()  # noqa: E731
        r1 = r1 + _alpha1(tp["h2"], w(blk.mlp.fc1), _alpha1(tp["g"], w(blk.mlp.fc2), r2))
        r0, ra = _simple(lambda p, q: p + q, [tp["t"], tp["ao"]], r1)
        f0 = r0.sum().abs() / (r0.sum().abs() + ra.sum().abs()) * r1.sum()
        r0, ra = r0 * f0 / r0.sum(), ra * (r1.sum() - f0) / ra.sum()
        ro = _alpha1(tp["o"], w(blk.attn.proj), ra).reshape(1, 17, 2, -1).transpose(1, 2)
        r_a, r_v = (z / 2 for z in _simple(lambda p, q: p @ q, [tp["a"], tp["v"]], ro))
        r_q, r_k = (z / 2 for z in _simple(lambda p, q: p @ q.transpose(-2, -1), [tp["q"], tp["k"]], r_a))
        rq = torch.stack([r_q, r_k, r_v]).permute(1, 3, 0, 2, 4).reshape(1, 17, -1)
        r = r0 + _alpha1(tp["h"], w(blk.attn.qkv), rq)
        rel.append(r_a[0])
    rel = rel[::-1]
    a, g = _grads(vit, 1)
    c = torch.eye(17, dtype=torch.float64)
    for gi, ri in zip(g, rel):
        c = c + (gi * ri).clamp_min(0).mean(0) @ c
    torch.testing.assert_close(B.transformer_attribution(vit, X, 1), up(c[0, 1:]))
    # the relevances are not the attention maps themselves (Chefer 2021b's gradient-only rule differs)
    assert not torch.allclose(rel[-1], a[-1])


def test_transition_attention_equation(vit):
    _, attns = manual(vit, X)
    r = torch.eye(17, dtype=torch.float64)
    for a in attns:
        r = (0.5 * a[0].mean(0) + 0.5 * torch.eye(17, dtype=torch.float64)) @ r
    ig = torch.zeros(16, dtype=torch.float64)
    for alpha in torch.linspace(0.25, 1.0, 4):
        vit.zero_grad()
        logits, at = manual(vit, alpha * X)
        logits[0, 0].backward()
        ig += at[-1].grad[0].mean(0)[0, 1:] / 4
    want = (r[0, 1:].detach() * ig).clamp_min(0)
    torch.testing.assert_close(B.transition_attention(vit, X, 0, steps=4), up(want))


def test_bidirectional_equation(vit):
    a, g = _grads(vit, 0)
    r = torch.eye(17, dtype=torch.float64)
    for ai, gi in zip(a, g):
        w = gi.mean((-1, -2)).clamp_min(0)
        r = r + (w[:, None, None] * ai).mean(0) @ r
    # feedback: IG w.r.t. the last block's input tokens, by a finite path sum written out here
    fb = torch.zeros(17, dtype=torch.float64)
    for alpha in torch.linspace(1 / 3, 1.0, 3):
        t = vit._pos_embed(vit.patch_embed(alpha * X))
        t = vit.blocks[0](t).detach().requires_grad_(True)
        out = vit.head(vit.norm(vit.blocks[1](t))[:, 0])
        (gt,) = torch.autograd.grad(out[0, 0], t)
        fb += (gt[0] * t[0]).sum(-1).detach() / 3
    want = r[0, 1:] * fb[1:].clamp_min(0)
    torch.testing.assert_close(B.bidirectional(vit, X, 0, steps=3), up(want))


def test_tis_token_subsets(vit):
    full = torch.ones(1, 16, dtype=torch.bool)
    torch.testing.assert_close(B.forward_tokens(vit, X, full), vit(X))
    keep = torch.zeros(1, 16, dtype=torch.bool)
    keep[0, [0, 5, 9]] = True
    # dropping tokens = running the blocks on the shorter sequence
    t = vit._pos_embed(vit.patch_embed(X))
    seq = torch.cat([t[:, :1], t[:, 1:][:, [0, 5, 9]]], 1)
    torch.testing.assert_close(B.forward_tokens(vit, X, keep), vit.head(vit.norm(vit.blocks(seq))[:, 0]))
    # TIS's masks: k-means centroids of every block's activation vectors (points over the 16 patch tokens)
    from sklearn.cluster import KMeans

    acts, tt = [], vit._pos_embed(vit.patch_embed(X))
    for blk in vit.blocks:
        tt = blk(tt)
        acts.append(tt[0, 1:].detach())
    pts = torch.cat(acts, -1).T.numpy()  # [16 * 2, 16]
    cent = torch.from_numpy(KMeans(n_clusters=6, n_init=1, random_state=3).fit(pts).cluster_centers_)
    masks = torch.zeros(6, 16, dtype=torch.float64)
    for i, c in enumerate(cent):
        masks[i, torch.topk(c, 8).indices] = 1
    torch.testing.assert_close(B.tis_masks(vit, X, n_masks=6, seed=3).double(), masks)
    p = torch.softmax(B.forward_tokens(vit, X, masks.bool()), 1)[:, 1]
    s = (p[:, None] * masks).sum(0) / masks.sum(0).clamp_min(1)
    s = (s - s.min()) / (s - s.min()).max()
    torch.testing.assert_close(B.tis(vit, X, 1, n_masks=6, seed=3), up(s))
    assert B.tis_masks(vit, X, n_masks=4, tokens_ratio=(0.25, 0.5)).sum(1).tolist() == [4, 8] * 4
    assert len(B.tis(vit, X, 1, n_masks=4, tokens_ratio=(0.25, 0.5))) == 8
    with pytest.raises(ConfigError, match="same number"):
        B.forward_tokens(vit, X, torch.tensor([[True] * 16, [True] * 8 + [False] * 8]))


def test_vit_cx_masks_and_causal_score(vit):
    from sklearn.cluster import AgglomerativeClustering

    # masks: norm1 features of the last block as 16 maps, upsampled, min-max normalised, clustered on cosine distance
    t = vit._pos_embed(vit.patch_embed(X))
    f = vit.blocks[-1].norm1(vit.blocks[0](t))[0, 1:].detach().T.reshape(16, 1, 4, 4)
    maps = F.interpolate(f, size=(8, 8), mode="bilinear", align_corners=False).reshape(16, 64)
    maps = (maps - maps.min(1, keepdim=True).values) / (
        maps.max(1, keepdim=True).values - maps.min(1, keepdim=True).values
    )
    cos = (maps @ maps.T) / (maps.norm(dim=1)[:, None] * maps.norm(dim=1)[None])
    lab = AgglomerativeClustering(n_clusters=None, distance_threshold=0.1, metric="precomputed", linkage="complete")
    labels = lab.fit_predict((1 - cos).clamp_min(0).numpy())
    summed = torch.stack([maps[torch.from_numpy(labels == c)].sum(0) for c in range(labels.max() + 1)])
    want = (summed - summed.min(1, keepdim=True).values) / (
        summed.max(1, keepdim=True).values - summed.min(1, keepdim=True).values
    )
    masks = B.vit_cx_masks(vit, X, 0.1)
    torch.testing.assert_close(masks, want.reshape(-1, 8, 8))
    assert 1 < len(masks) < 16
    # causal score with its noise step: s_k = p(x M + e (1 - M)) - p(x + e (1 - M)) + p(x), S = sum s_k M_k / sum M / K
    g = torch.Generator().manual_seed(5)
    e = torch.randn(len(masks), 1, 8, 8, generator=g, dtype=torch.float64) * 0.2 * (1 - masks[:, None])
    prob = lambda z: torch.softmax(vit(z), 1)[:, 2]  # noqa: E731
    s = prob(X[0] * masks[:, None] + e) - prob(X[0] + e) + prob(X)
    want_s = (s[:, None, None] * masks).sum(0) / masks.sum(0) / len(masks)
    torch.testing.assert_close(B.causal_score(vit, X, masks, 2, noise_std=0.2, seed=5), want_s.detach())
    torch.testing.assert_close(B.vit_cx(vit, X, 2, noise_std=0.2, seed=5), want_s.detach())
    # no noise, one mask: the score is p(x ⊙ M) wherever the mask is non-zero
    s1 = B.causal_score(vit, X, masks[:1], 2, noise_std=0.0)
    torch.testing.assert_close(
        s1[masks[0] > 0], prob(X[0] * masks[:1, None]).expand(int((masks[0] > 0).sum())).detach()
    )


class _LinearSoftmax(torch.nn.Module):
    """Logits ``W vec(x)`` of 2-channel 4x4 images (3 classes): IG's integrand has a closed form for autograd."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(3, 32, generator=torch.Generator().manual_seed(4), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(len(x), -1) @ self.w.T


def test_integrated_gradients_against_a_fine_path_integral():
    """``|sum_c IG_c|`` of the target's softmax from a black baseline, against an independent midpoint rule (4000
    steps, plain autograd). The channels disagree in sign on many pixels (random weights), so summing ``|IG_c|``
    instead, the wrong target, the wrong axis or a baseline equal to the input all fail."""
    model = _LinearSoftmax()
    x = torch.rand(1, 2, 4, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    alphas = (torch.arange(4000, dtype=torch.float64) + 0.5) / 4000
    path = (alphas[:, None, None, None] * x[0]).requires_grad_(True)
    (grads,) = torch.autograd.grad(torch.softmax(model(path), 1)[:, 1].sum(), path)
    ig = x[0] * grads.mean(0)  # [C, H, W]
    torch.testing.assert_close(ig.sum(), (torch.softmax(model(x), 1)[0, 1] - 1 / 3).detach(), atol=1e-6, rtol=0)
    got = B.integrated_gradients(model, x, 1, n_steps=50)
    torch.testing.assert_close(got, ig.sum(0).abs().detach(), atol=1e-6, rtol=0)
    assert not torch.allclose(got, ig.abs().sum(0), atol=1e-3)  # the channel sum is signed before the abs
    assert not torch.allclose(got, B.integrated_gradients(model, x, 2, n_steps=50), atol=1e-3)  # target matters


def test_gradcam_against_its_definition(vit):
    """pytorch-grad-cam on the last block's ``norm1`` tokens laid out on the 4x4 patch grid: ``ReLU(sum_d w_d A_d)``
    with ``w_d`` the spatial mean of the target logit's gradient, bilinearly resized to 8x8, min-max scaled."""
    net = vit.float()
    try:
        xf = X.float()
        feats = {}
        h = net.blocks[-1].norm1.register_forward_hook(lambda _m, _i, out: feats.__setitem__("f", out))
        try:
            logit = net(xf)[0, 2]
        finally:
            h.remove()
        (g,) = torch.autograd.grad(logit, feats["f"])
        a = feats["f"][0, 1:].detach().reshape(4, 4, 16).permute(2, 0, 1)  # [D, gh, gw], row-major token grid
        w = g[0, 1:].reshape(4, 4, 16).permute(2, 0, 1).mean((1, 2))
        cam = (w[:, None, None] * a).sum(0).clamp_min(0)
        up8 = F.interpolate(cam[None, None], size=(8, 8), mode="bilinear", align_corners=False)[0, 0]
        want = (up8 - up8.min()) / (up8 - up8.min()).max()  # the library min-max scales before and after resizing
        got = B.gradcam(net, xf, 2)
        torch.testing.assert_close(got, want.double(), atol=1e-5, rtol=0)
        assert float(want.std()) > 0.1  # not a flat map: a transposed grid or another class would differ
        assert not torch.allclose(got, B.gradcam(net, xf, 0), atol=1e-3)
    finally:
        vit.double()


def test_unknown_baseline_is_a_clear_error():
    with pytest.raises(ConfigError, match="unknown attribution method"):
        B.get_baseline("shap")
