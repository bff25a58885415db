"""RoPE as two elementwise products (the fast path of the TULIP text tower): ``x cos + swap(x) sin`` with the
interleaved-pair convention, ``swap(x)[2i] = -x[2i+1]``, ``swap(x)[2i+1] = x[2i]``. No complex dtype, so it runs
under bf16 autocast; parity with the 2x2 reference and the complex form is tested in float64."""

from __future__ import annotations

import torch


def rope_cos_sin(angles: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of ``angles`` ``[T, D/2]``, each repeated per pair: ``[T, D]``."""
    return angles.cos().repeat_interleave(2, -1).to(dtype), angles.sin().repeat_interleave(2, -1).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, H, T, D]`` by per-position ``cos``/``sin`` ``[T, D]`` (from :func:`rope_cos_sin`)."""
    pairs = x.unflatten(-1, (-1, 2))
    swapped = torch.stack([-pairs[..., 1], pairs[..., 0]], -1).flatten(-2)
    return x * cos + swapped * sin
