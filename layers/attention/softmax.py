"""Causal softmax attention: the Transformer++ baseline (RoPE), NoPE, and sliding-window attention (SWA).

``softmax(q k^T / sqrt(D) + M) v`` with ``M_ij = 0`` for ``i - window < j <= i`` and ``-inf`` otherwise
(``window=None``: full causal). ``position='rope'`` rotates q and k (Transformer++, Gated DeltaNet H1's SWA layers),
``'nope'`` uses no positions (the stick-breaking paper's NoPE baseline).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import ConfigError
from layers.attention.common import RotaryEmbedding, check_positive, split_heads

POSITIONS = ("rope", "nope")


class SoftmaxAttention(nn.Module):
    """Multi-head causal softmax attention ``[B, T, d_model] -> [B, T, d_model]``.

    Args:
        d_model: Model width.
        num_heads: Heads ``H``.
        head_dim: Size per head (default ``d_model / H``).
        position: ``rope`` or ``nope``.
        window: Sliding-window size (keys ``i - window < j <= i``); ``None`` for full causal attention.
        rope_base: RoPE frequency base.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int = 2,
        head_dim: int | None = None,
        position: str = "rope",
        window: int | None = None,
        rope_base: float = 10000.0,
    ) -> None:
        super().__init__()
        check_positive("d_model", d_model)
        self.num_heads = num_heads
        self.head_dim = split_heads(d_model, num_heads, head_dim, "softmax")
        if position not in POSITIONS:
            raise ConfigError(f"softmax.position={position!r} must be one of {list(POSITIONS)}")
        if window is not None:
            check_positive("softmax.window", window)
        self.window = window
        inner = num_heads * self.head_dim
        self.qkv_proj = nn.Linear(d_model, 3 * inner, bias=False)
        self.o_proj = nn.Linear(inner, d_model, bias=False)
        self.rope = RotaryEmbedding(self.head_dim, rope_base) if position == "rope" else None

    def mask(self, t: int, device: torch.device) -> torch.Tensor | None:
        """Boolean ``[T, T]`` mask (True = attend) for SWA; ``None`` means plain causal."""
        if self.window is None or self.window >= t:
            return None
        i = torch.arange(t, device=device)
        d = i[:, None] - i[None, :]
        return (d >= 0) & (d < self.window)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, T, d_model] -> [B, T, d_model]``."""
        b, t, _ = x.shape
        q, k, v = self.qkv_proj(x).view(b, t, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.rope is not None:
            q, k = self.rope(q), self.rope(k)
        m = self.mask(t, x.device)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=m is None)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))
