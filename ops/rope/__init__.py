"""Rotary position embedding (RoPE) for TULIP (ICLR 2025): frequencies, NTK-aware scaling, rotation of q/k.

``naive.py`` rotates each interleaved pair with an explicit 2x2 rotation (the readable reference); ``complex.py``
is the complex-multiply form the official code uses (LLaMA-meta convention: pairs ``(x[2i], x[2i+1])``).
"""

from __future__ import annotations

from ops.rope.complex import apply_rope_complex, rope_cis
from ops.rope.interleaved import apply_rope, rope_cos_sin
from ops.rope.naive import naive_apply_rope, ntk_theta, rope_angles, rope_frequencies

__all__ = [
    "apply_rope",
    "apply_rope_complex",
    "rope_cos_sin",
    "naive_apply_rope",
    "ntk_theta",
    "rope_angles",
    "rope_cis",
    "rope_frequencies",
]
