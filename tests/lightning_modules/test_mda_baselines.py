"""Attribution baselines on a tiny float64 timm ViT, each against its defining equation.

The oracle is an explicit forward pass written from the block weights (attention matrices as plain autograd
tensors), independent of the hooks the baselines use.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

from lightning_modules.mda import baselines as B
from suite.errors import ConfigError


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


def test_transformer_attribution_equation(vit):
    a, g = _grads(vit, 1)
    r = torch.eye(17, dtype=torch.float64)
    for ai, gi in zip(a, g):
        r = r + (gi * ai).clamp_min(0).mean(0) @ r
    torch.testing.assert_close(B.transformer_attribution(vit, X, 1), up(r[0, 1:]))


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
    s = B.tis(vit, X, 1, n_masks=8, seed=3)
    g = torch.Generator().manual_seed(3)
    masks = torch.zeros(8, 16, dtype=torch.float64)
    for i in range(8):
        masks[i, torch.randperm(16, generator=g)[:8]] = 1
    p = torch.softmax(B.forward_tokens(vit, X, masks.bool()), 1)[:, 1]
    torch.testing.assert_close(s, up((p[:, None] * masks).sum(0) / masks.sum(0).clamp_min(1)))
    with pytest.raises(ConfigError, match="same number"):
        B.forward_tokens(vit, X, torch.tensor([[True] * 16, [True] * 8 + [False] * 8]))


def test_vit_cx_density_corrected_score(vit):
    s = B.vit_cx(vit, X, 0, n_clusters=4)
    assert s.shape == (8, 8) and bool(torch.isfinite(s).all())
    # one cluster: a single mask M, S = p(x ⊙ M) M / M = p(x ⊙ M) everywhere the mask is non-zero
    s1 = B.vit_cx(vit, X, 0, n_clusters=1)
    assert float(s1.max() - s1.min()) < 1e-9 and 0 < float(s1.max()) < 1


def test_library_baselines_run(vit):
    ig = B.integrated_gradients(vit, X, 0, n_steps=8)
    assert ig.shape == (8, 8) and float(ig.min()) >= 0 and float(ig.max()) > 0
    cam = B.gradcam(vit.float(), X.float(), 0)
    vit.double()
    assert cam.shape == (8, 8) and float(cam.min()) >= 0 and float(cam.max()) <= 1 + 1e-6
    with pytest.raises(ConfigError, match="unknown attribution method"):
        B.get_baseline("shap")
