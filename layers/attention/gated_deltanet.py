"""Gated DeltaNet token mixer (Yang, Kautz & Hatamizadeh, "Gated Delta Networks", ICLR 2025, §3.4 and Fig. 1).

Per head, with ``x`` the block input::

    q, k, v = SiLU(ShortConv(W_q x)), SiLU(ShortConv(W_k x)), SiLU(ShortConv(W_v x))
    q, k    = q / ||q||, k / ||k||                                  # L2 norm (§3.4)
    alpha   = exp(g),  g = -exp(A_log) * softplus(W_a x + dt_bias)   # Mamba2 gate, Eq. (3)
    beta    = sigmoid(W_b x)                                         # (2 sigmoid with allow_neg_eigval)
    S_t     = S_{t-1} alpha_t (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,  o_t = S_t q_t     # Eq. (10)
    y       = W_o (RMSNorm(o) * SiLU(W_g x))                         # output gate

``use_gate=False`` gives DeltaNet (Eq. (5)), ``use_delta=False`` Mamba2-style gated linear attention (Eq. (3)):
the paper's two components, compared at equal parameters except for the gate projection.
Sizes follow the NVlabs layer: keys 0.75 d, values 1.5 d (``head_dim = 0.75 d / H``, ``expand_v = 2``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import ConfigError
from layers.attention.common import ShortConvolution, check_positive, split_heads
from ops.gated_delta_rule import BACKENDS, check_chunk_size, gated_delta_rule


def no_weight_decay(p: nn.Parameter) -> nn.Parameter:
    """Mark a parameter to be excluded from weight decay (read by the LM system's parameter groups)."""
    p._no_weight_decay = True  # type: ignore[attr-defined]
    return p


class GatedDeltaNet(nn.Module):
    """Gated DeltaNet mixer ``[B, T, d_model] -> [B, T, d_model]``.

    Args:
        d_model: Model width.
        num_heads: Heads ``H``.
        head_dim: Key/query size per head (default ``0.75 d_model / H``, the paper's key width).
        expand_v: Value size per head is ``expand_v * head_dim``.
        use_gate: Decay gate ``alpha`` (``False``: DeltaNet).
        use_delta: Delta-rule erase (``False``: Mamba2-style gated linear attention).
        use_short_conv: Depthwise causal convolutions on q, k, v.
        conv_size: Their kernel size.
        conv_init_std: Init of the convolutions' weights: ``None`` keeps PyTorch's default (kaiming-uniform, bound
            ``1 / sqrt(conv_size)``, as the NVlabs code); ``0.02`` draws ``N(0, 0.02^2)``, as fla's
            ``GatedDeltaNetForCausalLM`` init does. q and k are L2-normalised after the convolution, so under Adam a
            small init lets the convolution's taps turn much faster.
        use_output_gate: ``RMSNorm(o) * SiLU(W_g x)`` (else ``RMSNorm(o)``).
        allow_neg_eigval: ``beta = 2 sigmoid`` (range ``[0, 2)``, fla option).
        a_init_range: ``A ~ U(lo, hi)`` at init (Mamba2's ``A_init_range``; fla / the paper's code: ``(0, 16)``).
        dt_init_range: ``dt`` log-uniform in ``[lo, hi]`` at init (Mamba2's ``dt_min`` / ``dt_max``; default
            ``(1e-3, 0.1)``). With the defaults the initial decay ``exp(-A dt)`` forgets within tens of tokens;
            a smaller range starts the gate near 1 (a diagnostic, not the paper's init).
        chunk_size: ``C`` of the chunked algorithm (power of two).
        backend: ``auto`` (fla on CUDA if installed, else chunked), ``chunk``, ``recurrent`` or ``fla``.
        norm_eps: RMSNorm epsilon.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int = 2,
        head_dim: int | None = None,
        expand_v: float = 2.0,
        use_gate: bool = True,
        use_delta: bool = True,
        use_short_conv: bool = True,
        conv_size: int = 4,
        conv_init_std: float | None = None,
        use_output_gate: bool = True,
        allow_neg_eigval: bool = False,
        a_init_range: Sequence[float] = (0.0, 16.0),
        dt_init_range: Sequence[float] = (1e-3, 0.1),
        chunk_size: int = 64,
        backend: str = "auto",
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        check_positive("d_model", d_model)
        check_positive("num_heads", num_heads)
        if head_dim is None:
            head_dim = max(1, int(0.75 * d_model) // num_heads)
        split_heads(d_model, num_heads, head_dim, "gated_deltanet")
        try:
            check_chunk_size(chunk_size)
        except ValueError as err:
            raise ConfigError(f"gated_deltanet.{err}") from None
        if backend not in BACKENDS:
            raise ConfigError(f"gated_deltanet.backend={backend!r} must be one of {list(BACKENDS)}")
        if expand_v <= 0 or (expand_v * head_dim) % 1:
            raise ConfigError(f"gated_deltanet.expand_v={expand_v} must make expand_v * head_dim a positive integer")
        for name, rng in (("a_init_range", a_init_range), ("dt_init_range", dt_init_range)):
            if len(rng) != 2:
                raise ConfigError(f"gated_deltanet.{name}={list(rng)} must be [lo, hi]")
        a_lo, a_hi = (float(v) for v in a_init_range)
        dt_lo, dt_hi = (float(v) for v in dt_init_range)
        if not 0 <= a_lo <= a_hi:
            raise ConfigError(f"gated_deltanet.a_init_range={list(a_init_range)} must be [lo, hi] with 0 <= lo <= hi")
        if not 0 < dt_lo <= dt_hi:
            raise ConfigError(f"gated_deltanet.dt_init_range={list(dt_init_range)} must be [lo, hi] with 0 < lo <= hi")
        self.num_heads, self.head_dim, self.v_dim = num_heads, head_dim, int(expand_v * head_dim)
        self.use_gate, self.use_delta, self.use_output_gate = use_gate, use_delta, use_output_gate
        self.allow_neg_eigval, self.chunk_size, self.backend = allow_neg_eigval, chunk_size, backend
        key_dim, value_dim = num_heads * head_dim, num_heads * self.v_dim
        self.q_proj = nn.Linear(d_model, key_dim, bias=False)
        self.k_proj = nn.Linear(d_model, key_dim, bias=False)
        self.v_proj = nn.Linear(d_model, value_dim, bias=False)
        self.b_proj = nn.Linear(d_model, num_heads, bias=True)
        # beta starts at sigmoid(W_b x) with no offset: the NVlabs recipe zeroes every Linear bias at init and fla's
        # b_proj has none (PyTorch's default would draw it from U(+-1/sqrt(d)); zeros_ draws no random numbers)
        nn.init.zeros_(self.b_proj.bias)
        if use_gate:
            self.a_proj = nn.Linear(d_model, num_heads, bias=False)
            # Mamba2 init: A ~ U(0, 16), dt log-uniform in [1e-3, 0.1] (floor 1e-4), dt_bias = softplus^-1(dt)
            a = torch.empty(num_heads).uniform_(a_lo, a_hi).clamp_min(1e-4)
            self.A_log = no_weight_decay(nn.Parameter(a.log()))
            dt = torch.exp(torch.rand(num_heads) * (math.log(dt_hi) - math.log(dt_lo)) + math.log(dt_lo))
            dt = dt.clamp_min(min(1e-4, dt_lo))
            self.dt_bias = no_weight_decay(nn.Parameter(dt + torch.log(-torch.expm1(-dt))))
        self.convs = nn.ModuleList(
            [ShortConvolution(n, conv_size, conv_init_std) for n in (key_dim, key_dim, value_dim)]
            if use_short_conv
            else []
        )
        if use_output_gate:
            self.g_proj = nn.Linear(d_model, value_dim, bias=False)
        self.o_norm = nn.RMSNorm(self.v_dim, eps=norm_eps)
        self.o_proj = nn.Linear(value_dim, d_model, bias=False)

    def gate(self, x: torch.Tensor) -> torch.Tensor | None:
        """Log-decay ``g = -exp(A_log) softplus(W_a x + dt_bias)`` ``[B, T, H]`` (``None`` without gate)."""
        if not self.use_gate:
            return None
        return -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, T, d_model] -> [B, T, d_model]``."""
        b, t, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.convs:
            q, k, v = (conv(z) for conv, z in zip(self.convs, (q, k, v)))
        else:
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
        q = F.normalize(q.view(b, t, self.num_heads, self.head_dim), dim=-1)
        k = F.normalize(k.view(b, t, self.num_heads, self.head_dim), dim=-1)
        v = v.view(b, t, self.num_heads, self.v_dim)
        beta = self.b_proj(x).sigmoid()
        if self.allow_neg_eigval:
            beta = beta * 2
        o, _ = gated_delta_rule(
            q, k, v, beta, self.gate(x), chunk_size=self.chunk_size, use_delta=self.use_delta, backend=self.backend
        )
        o = self.o_norm(o)
        if self.use_output_gate:
            o = o * F.silu(self.g_proj(x).view(b, t, self.num_heads, self.v_dim))
        return self.o_proj(o.reshape(b, t, -1))
