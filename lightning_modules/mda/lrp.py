"""Layer-wise relevance propagation through a timm ``VisionTransformer``, as Chefer, Gur & Wolf (CVPR 2021) define it
for their *Transformer Attribution*; used by :func:`lightning_modules.mda.baselines.transformer_attribution`.

Rules (paper Sec. 3.1-3.2, eqs. 2-7), relevance ``R`` flowing from the target logit (a one-hot start, ``R = 1`` on the
target class) to the block inputs:

* layers with weights (``qkv``, ``proj``, ``fc1``, ``fc2``, ``head``): the ``alpha = 1, beta = 0`` rule (eq. 3),
  ``R_i = sum_j (x_i^+ w_ji^+ + x_i^- w_ji^-) / (sum_i' x_i'^+ w_ji'^+ + x_i'^- w_ji'^-) R_j`` (biases ignored);
* non-linear element-wise layers (GELU, softmax, LayerNorm, dropout, LayerScale): relevance passes unchanged;
* the two-operand products ``A V`` and ``Q K^T``: gradient-times-input of each operand,
  ``R^u = u ⊙ d(uv)/du · (R / uv)`` (eq. 4), each halved so that the pair conserves the relevance;
* the residual sums ``a + b`` (eqs. 6-7): gradient-times-input split, rescaled so that the two parts keep their
  share ``|sum R^a| / (|sum R^a| + |sum R^b|)`` of the incoming total ``sum R``;
* a tensor used twice (the residual branch point): the two relevances are summed.

``captum.attr.LRP`` would be the library choice, but it propagates only through ``nn.Module`` layers of known types
and has no rule for the functional attention products and softmax inside timm's ``Attention``; so the forward pass
is replayed here from the block weights (checked against the model's own logits) and the rules are applied to its
stored tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from core.errors import ConfigError


def safe_divide(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-9) -> torch.Tensor:
    """``a / b`` with ``b`` pushed away from 0 by ``eps`` (keeping its sign), and 0 where ``b == 0``."""
    den = b.clamp(min=eps) + b.clamp(max=eps)
    den = den + (den == 0).to(b.dtype) * eps
    return a / den * (b != 0).to(b.dtype)


def lrp_linear(x: torch.Tensor, weight: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The ``alpha = 1, beta = 0`` rule of ``y = x W^T`` (bias ignored): relevance ``r`` of ``y`` -> that of ``x``."""
    xp, xn = x.clamp(min=0), x.clamp(max=0)
    wp, wn = weight.clamp(min=0), weight.clamp(max=0)
    s = safe_divide(r, xp @ wp.T + xn @ wn.T)
    return xp * (s @ wp) + xn * (s @ wn)


def lrp_matmul(u: torch.Tensor, v: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Relevance of the operands of ``z = u @ v`` (batched): ``u ⊙ (s v^T) / 2``, ``v ⊙ (u^T s) / 2``, ``s = r / z``."""
    s = safe_divide(r, u @ v)
    return u * (s @ v.transpose(-2, -1)) / 2, v * (u.transpose(-2, -1) @ s) / 2


def lrp_add(a: torch.Tensor, b: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Relevance of the summands of ``a + b``, normalised to conserve ``sum r`` in the parts' proportions."""
    s = safe_divide(r, a + b)
    ra, rb = a * s, b * s
    sa, sb = ra.sum(), rb.sum()
    total = sa.abs() + sb.abs()
    fa = safe_divide(sa.abs(), total) * r.sum()
    fb = safe_divide(sb.abs(), total) * r.sum()
    return ra * safe_divide(fa, sa), rb * safe_divide(fb, sb)


@dataclass
class _BlockTape:
    t: torch.Tensor  # block input [B, N, D]
    h1: torch.Tensor  # norm1(t)
    q: torch.Tensor  # [B, H, N, d] (unscaled)
    k: torch.Tensor
    v: torch.Tensor
    attn: torch.Tensor  # softmax probabilities [B, H, N, N] (grad retained)
    o: torch.Tensor  # heads concatenated [B, N, H * d]
    a_out: torch.Tensor  # ls1(proj(o))
    t1: torch.Tensor  # t + a_out
    h2: torch.Tensor  # norm2(t1)
    g: torch.Tensor  # mlp.norm(act(fc1(h2)))
    m_out: torch.Tensor  # ls2(fc2(g))


def _block_forward(blk: nn.Module, t: torch.Tensor) -> tuple[torch.Tensor, _BlockTape]:
    at = blk.attn
    h1 = blk.norm1(t)
    b, n, _ = h1.shape
    nh = at.num_heads
    qkv = at.qkv(h1).reshape(b, n, 3, nh, -1).permute(2, 0, 3, 1, 4)
    q, k, v = at.q_norm(qkv[0]), at.k_norm(qkv[1]), qkv[2]
    a = torch.softmax((q * at.scale) @ k.transpose(-2, -1), dim=-1)
    a.retain_grad()
    o = (a @ v).transpose(1, 2).reshape(b, n, -1)
    a_out = blk.ls1(at.proj(at.norm(o)))
    t1 = t + a_out
    h2 = blk.norm2(t1)
    g = blk.mlp.norm(blk.mlp.act(blk.mlp.fc1(h2)))
    m_out = blk.ls2(blk.mlp.fc2(g))
    return t1 + m_out, _BlockTape(t, h1, q, k, v, a, o, a_out, t1, h2, g, m_out)


def _block_relprop(blk: nn.Module, tape: _BlockTape, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Relevance of the block input and of its attention probabilities, from the relevance ``r`` of its output."""
    r_t1, r_mlp = lrp_add(tape.t1, tape.m_out, r)
    r_h2 = lrp_linear(tape.h2, blk.mlp.fc1.weight, lrp_linear(tape.g, blk.mlp.fc2.weight, r_mlp))
    r_t1 = r_t1 + r_h2  # norm2 passes relevance; the branch point sums
    r_t, r_att = lrp_add(tape.t, tape.a_out, r_t1)
    r_o = lrp_linear(tape.o, blk.attn.proj.weight, r_att)
    b, n, _ = r_o.shape
    nh = blk.attn.num_heads
    r_o = r_o.reshape(b, n, nh, -1).transpose(1, 2)  # [B, H, N, d]
    r_a, r_v = lrp_matmul(tape.attn, tape.v, r_o)
    r_q, r_kt = lrp_matmul(tape.q, tape.k.transpose(-2, -1), r_a)  # softmax passes relevance
    r_qkv = torch.stack([r_q, r_kt.transpose(-2, -1), r_v]).permute(1, 3, 0, 2, 4).reshape(b, n, -1)
    r_t = r_t + lrp_linear(tape.h1, blk.attn.qkv.weight, r_qkv)
    return r_t, r_a


def attention_relevance(
    model: nn.Module, x: torch.Tensor, target: int
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Logits, every block's attention probabilities ``A_b`` ``[B, H, N, N]`` and their LRP relevances ``R^(A_b)``.

    ``A_b.grad`` holds the gradient of the target logit (the backward pass runs here).

    Raises:
        ConfigError: the model is not a plain timm ViT with class-token pooling (the replayed forward pass does not
            reproduce its logits).
    """
    if getattr(model, "global_pool", "token") != "token" or not hasattr(model, "blocks"):
        raise ConfigError("transformer_attribution needs a timm VisionTransformer with class-token pooling")
    with torch.enable_grad():
        t = model.norm_pre(model._pos_embed(model.patch_embed(x)))
        tapes = []
        for blk in model.blocks:
            t, tape = _block_forward(blk, t)
            tapes.append(tape)
        feats = model.norm(t)
        pooled = model.fc_norm(feats[:, 0])
        logits = model.head(pooled)
        with torch.no_grad():
            ref = model(x)
        if not torch.allclose(logits, ref, rtol=1e-4, atol=1e-5):
            raise ConfigError(
                f"transformer_attribution cannot replay {type(model).__name__}'s forward pass (not a plain timm ViT)"
            )
        model.zero_grad(set_to_none=True)
        logits[0, target].backward()
    with torch.no_grad():
        one_hot = torch.zeros_like(logits)
        one_hot[:, target] = 1.0
        r_cls = lrp_linear(pooled, model.head.weight, one_hot)
        r = torch.zeros_like(feats)
        r[:, 0] = r_cls  # class-token pooling: the relevance lands on the CLS token; norm passes it
        rel = []
        for blk, tape in zip(reversed(model.blocks), reversed(tapes)):
            r, r_a = _block_relprop(blk, tape, r)
            rel.append(r_a)
    return logits.detach(), [tp.attn for tp in tapes], rel[::-1]
