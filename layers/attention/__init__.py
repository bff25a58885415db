"""Token mixers for the causal-LM system: Gated DeltaNet (+ DeltaNet / Mamba2-style switches), stick-breaking,
softmax attention (RoPE / NoPE / sliding window)."""

from __future__ import annotations

from layers.attention.common import RotaryEmbedding, ShortConvolution, SwiGLU
from layers.attention.gated_deltanet import GatedDeltaNet
from layers.attention.softmax import SoftmaxAttention
from layers.attention.stickbreaking import StickBreakingAttention

__all__ = [
    "GatedDeltaNet",
    "RotaryEmbedding",
    "ShortConvolution",
    "SoftmaxAttention",
    "StickBreakingAttention",
    "SwiGLU",
]
