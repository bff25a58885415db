"""Stick-breaking attention mixer (Tan, Yang, Panda & Courville, "Scaling Stick-Breaking Attention", ICLR 2025).

``A_ij = sigmoid(z_ij) prod_{j<k<i} (1 - sigmoid(z_ik))`` replaces softmax; there are no positional embeddings
(Eq. (1)-(2)). The leftover stick ``rem_i = 1 - sum_j A_ij`` is handled by ``remainder``:

* ``head_bias`` (IBM dolomite-engine model, the default): ``o_i + rem_i * b_h`` with a learned per-head vector
  ``b_h`` initialised to zero, then ``GroupNorm(num_heads)`` over the heads;
* ``value`` (the official repo's tests and benchmarks): ``o_i + rem_i * v_i`` (leftover mass to the current token);
* ``none``: drop it.
"""

from __future__ import annotations

import torch
from torch import nn

from core.errors import ConfigError
from layers.attention.common import check_positive, split_heads
from ops.stickbreaking import blockwise_stickbreaking, naive_stickbreaking

REMAINDERS = ("head_bias", "value", "none")
SB_BACKENDS = ("blockwise", "naive")


class StickBreakingAttention(nn.Module):
    """Multi-head stick-breaking attention ``[B, T, d_model] -> [B, T, d_model]``.

    Args:
        d_model: Model width.
        num_heads: Heads ``H``.
        head_dim: Size per head (default ``d_model / H``).
        attend_current: Include the current token in the stick.
        remainder: ``head_bias``, ``value`` or ``none`` (see module docstring).
        group_norm: ``GroupNorm(H)`` on the concatenated heads before ``o_proj`` (dolomite model).
        inv_temp: Logit scale (default ``head_dim ** -0.5``).
        block_size: Key block of the blockwise op (power of two).
        backend: ``blockwise`` (never forms the ``T x T`` matrix) or ``naive`` (O(T^2) reference).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int = 2,
        head_dim: int | None = None,
        attend_current: bool = False,
        remainder: str = "head_bias",
        group_norm: bool = True,
        inv_temp: float | None = None,
        block_size: int = 64,
        backend: str = "blockwise",
    ) -> None:
        super().__init__()
        check_positive("d_model", d_model)
        self.num_heads = num_heads
        self.head_dim = split_heads(d_model, num_heads, head_dim, "stickbreaking")
        if remainder not in REMAINDERS:
            raise ConfigError(f"stickbreaking.remainder={remainder!r} must be one of {list(REMAINDERS)}")
        if backend not in SB_BACKENDS:
            raise ConfigError(f"stickbreaking.backend={backend!r} must be one of {list(SB_BACKENDS)}")
        if not isinstance(block_size, int) or block_size < 1 or block_size & (block_size - 1):
            raise ConfigError(f"stickbreaking.block_size={block_size!r} must be a positive power of two")
        self.attend_current, self.remainder, self.block_size, self.backend = (
            attend_current,
            remainder,
            block_size,
            backend,
        )
        self.inv_temp = inv_temp
        inner = num_heads * self.head_dim
        self.qkv_proj = nn.Linear(d_model, 3 * inner, bias=False)
        self.head_bias = nn.Parameter(torch.zeros(num_heads, self.head_dim)) if remainder == "head_bias" else None
        self.norm = nn.GroupNorm(num_heads, inner) if group_norm else None
        self.o_proj = nn.Linear(inner, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, T, d_model] -> [B, T, d_model]``."""
        b, t, _ = x.shape
        q, k, v = self.qkv_proj(x).view(b, t, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.backend == "naive":
            o, rem = naive_stickbreaking(q, k, v, self.inv_temp, self.attend_current)
        else:
            o, rem = blockwise_stickbreaking(q, k, v, self.inv_temp, self.attend_current, self.block_size)
        if self.remainder == "head_bias":
            o = o + rem[..., None] * self.head_bias[None, :, None, :]
        elif self.remainder == "value":
            o = o + rem[..., None] * v
        o = o.transpose(1, 2).reshape(b * t, -1)  # [B*T, H*D]
        if self.norm is not None:
            o = self.norm(o)
        return self.o_proj(o.view(b, t, -1))
