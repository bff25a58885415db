"""Attention variants of "Systematic Outliers in Large Language Models" (ICLR 2025), as mixers of :mod:`layers.lm`.

Per head, causal, ``S = q k^T / sqrt(D)``, ``d = D`` the head size (paper Sec. 5, official ``gpt-2/model_*.py``):

* ``softmax`` (a): ``y = softmax(S) V`` -- the outlier-prone baseline.
* ``zero_logit``: ``y = sum_j e^{S_j} v_j / (1 + sum_j e^{S_j})`` -- softmax with an extra zero logit (a key with
  score 0 and value 0), i.e. an implicit scaling ``1 - a_0`` without any bias.
* ``fixed_bias`` (b): ``y = softmax(S) V + v'`` with ``v'`` a learned, zero-initialised per-head vector.
* ``ca_bias`` (c): ``y = softmax(S) V + a_0(x) v'``, ``a_0 = e^{q.k'/sqrt(D)} / (e^{q.k'/sqrt(D)} + sum_j e^{S_j})``
  (explicit context-aware bias, no scaling of the softmax term).
* ``kv_bias`` (d): ``y = softmax([q.k'/sqrt(D); S]) [v'; V]`` -- a learnable key/value slot every query sees
  ("attention bias"): a context-aware bias plus the implicit scaling ``1 - a_0``.
* ``ca_scale`` (e): ``y = S_c(x) softmax(S) V`` with ``S_c = 2 sigmoid(W_s x)`` per token and head, in ``(0, 2)``
  (explicit context-aware scaling factor; ``x`` is the block's normed input).
* ``sigmoid`` (f): ``y = sigmoid(S - log T) V`` with causal zeros, ``T`` the current sequence length.

``k', v'`` are per-head, initialised ``N(0, 0.02)`` as in the official code (``fixed_bias``: zeros). The official
``model_vbias.py`` adds an ``n_embd``-sized bias to the per-head tensor, which cannot broadcast; the per-head
``head_dim`` bias implemented here is its intended meaning (see ``papers/systematic_outliers.md``).

Two backends: ``naive`` materialises the probabilities (and keeps them in ``last_attention`` when
``record_attention`` is set, for the outlier census), ``sdpa`` uses ``F.scaled_dot_product_attention`` with the extra
slot as a prepended key column. ``tests/layers/test_systematic_outliers_attention.py`` checks their parity in float64.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import ConfigError
from layers.attention.common import RotaryEmbedding, check_positive, split_heads

VARIANTS = ("softmax", "zero_logit", "fixed_bias", "ca_bias", "kv_bias", "ca_scale", "sigmoid")
BACKENDS = ("naive", "sdpa")
POSITIONS = ("rope", "nope")


class OutlierVariantAttention(nn.Module):
    """Multi-head causal attention with one of the paper's outlier-removing modifications.

    Args:
        d_model: Model width.
        num_heads: Heads ``H``.
        variant: One of ``softmax, zero_logit, fixed_bias, ca_bias, kv_bias, ca_scale, sigmoid``.
        position: ``nope`` (use the LM's learned absolute positions, as the GPT-2 code) or ``rope``.
        backend: ``naive`` (explicit probabilities) or ``sdpa``.
        bias_std: Init std of ``k', v'`` (official: 0.02).

    Attributes:
        record_attention: When True, ``forward`` keeps ``last_attention [B, H, T, T]`` (probabilities over the real
            keys; the extra slot of ``zero_logit / ca_bias / kv_bias`` is left out, so rows may sum to < 1).
        kv_quantizer: Optional callable applied to ``k`` and ``v`` (``[B, H, T, D]``), e.g. KV-cache fake quantization.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int = 4,
        variant: str = "softmax",
        position: str = "nope",
        backend: str = "sdpa",
        bias_std: float = 0.02,
    ) -> None:
        super().__init__()
        check_positive("d_model", d_model)
        self.num_heads = num_heads
        self.head_dim = split_heads(d_model, num_heads, None, "outlier_variant")
        if variant not in VARIANTS:
            raise ConfigError(f"mixer.variant={variant!r} must be one of {list(VARIANTS)}")
        if backend not in BACKENDS:
            raise ConfigError(f"mixer.backend={backend!r} must be one of {list(BACKENDS)}")
        if position not in POSITIONS:
            raise ConfigError(f"mixer.position={position!r} must be one of {list(POSITIONS)}")
        self.variant, self.backend = variant, backend
        self.qkv_proj = nn.Linear(d_model, 3 * d_model, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)
        self.rope = RotaryEmbedding(self.head_dim) if position == "rope" else None
        h, d = num_heads, self.head_dim
        self.k_bias = nn.Parameter(torch.randn(h, d) * bias_std) if variant in ("ca_bias", "kv_bias") else None
        if variant in ("ca_bias", "kv_bias"):
            self.v_bias = nn.Parameter(torch.randn(h, d) * bias_std)
        elif variant == "fixed_bias":
            self.v_bias = nn.Parameter(torch.zeros(h, d))
        else:
            self.v_bias = None
        self.scale_proj = nn.Linear(d_model, num_heads, bias=True) if variant == "ca_scale" else None
        self.record_attention = False
        self.last_attention: torch.Tensor | None = None
        self.kv_quantizer = None

    def _extra_slot(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The prepended key/value ``[B, H, 1, D]`` of the slot variants, or ``None``."""
        b, h, _, d = q.shape
        if self.variant == "zero_logit":
            z = q.new_zeros(b, h, 1, d)
            return z, z
        if self.variant == "ca_bias":
            return self.k_bias.to(q)[None, :, None].expand(b, h, 1, d), q.new_zeros(b, h, 1, d)
        if self.variant == "kv_bias":
            return (
                self.k_bias.to(q)[None, :, None].expand(b, h, 1, d),
                self.v_bias.to(q)[None, :, None].expand(b, h, 1, d),
            )
        return None

    def _naive(self, q, k, v, x) -> torch.Tensor:
        t = q.shape[2]
        s = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)  # [B, H, T, T]
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        if self.variant == "sigmoid":
            p = torch.sigmoid(s - math.log(t)).masked_fill(~causal, 0.0)
            y = p @ v
        else:
            s = s.masked_fill(~causal, float("-inf"))
            slot = self._extra_slot(q)
            if slot is None:
                p = torch.softmax(s, dim=-1)
                y = p @ v
            else:
                k0, v0 = slot
                s0 = (q * k0).sum(-1, keepdim=True) / math.sqrt(self.head_dim)  # [B, H, T, 1]
                pa = torch.softmax(torch.cat([s0, s], dim=-1), dim=-1)
                a0, p = pa[..., :1], pa[..., 1:]
                y = a0 * v0 + p @ v
                if self.variant == "ca_bias":  # the bias term comes on top of an unscaled softmax (Eq. of (c))
                    p = torch.softmax(s, dim=-1)
                    y = p @ v + a0 * self.v_bias.to(q)[None, :, None]
        if self.record_attention:
            self.last_attention = p.detach()
        return y

    def _sdpa(self, q, k, v) -> torch.Tensor:
        t = q.shape[2]
        slot = self._extra_slot(q)
        if slot is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        k0, v0 = slot
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        mask = torch.cat([torch.ones(t, 1, dtype=torch.bool, device=q.device), causal], dim=1)
        if self.variant == "ca_bias":  # softmax(S)V + SDPA(Q, [k'; K], [v'; 0])
            main = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            vb = self.v_bias.to(q)[None, :, None].expand_as(v0)
            extra = F.scaled_dot_product_attention(
                q, torch.cat([k0, k], 2), torch.cat([vb, torch.zeros_like(v)], 2), attn_mask=mask
            )
            return main + extra
        return F.scaled_dot_product_attention(q, torch.cat([k0, k], 2), torch.cat([v0, v], 2), attn_mask=mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, T, d_model]`` (the block's normed input) ``-> [B, T, d_model]``."""
        b, t, _ = x.shape
        q, k, v = self.qkv_proj(x).view(b, t, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.rope is not None:
            q, k = self.rope(q), self.rope(k)
        if self.kv_quantizer is not None:
            k, v = self.kv_quantizer(k), self.kv_quantizer(v)
        use_naive = self.backend == "naive" or self.record_attention or self.variant == "sigmoid"
        y = self._naive(q, k, v, x) if use_naive else self._sdpa(q, k, v)
        if self.variant == "fixed_bias":
            y = y + self.v_bias.to(y)[None, :, None]
        if self.scale_proj is not None:  # S_c(x) = 2 sigmoid(W_s x), [B, T, H] -> [B, H, T, 1]
            y = y * (2 * torch.sigmoid(self.scale_proj(x))).transpose(1, 2)[..., None]
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))
