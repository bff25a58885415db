"""RoPE in complex form (the official TULIP code, LLaMA-meta convention): ``view_as_complex`` of interleaved pairs
times ``exp(i m omega)``; parity with :func:`ops.rope.naive.naive_apply_rope` is tested in float64."""

from __future__ import annotations

import torch


def rope_cis(angles: torch.Tensor) -> torch.Tensor:
    """``exp(i * angles)`` as a complex tensor ``[T, D/2]`` (``torch.polar``)."""
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope_complex(x: torch.Tensor, cis: torch.Tensor) -> torch.Tensor:
    """Rotate queries/keys ``x`` ``[B, H, T, D]`` by ``cis`` ``[T, D/2]`` (complex): Eq. (2) of TULIP as a product
    of complex numbers ``(x[2i] + i x[2i+1]) * exp(i m omega_i)``."""
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    xc = torch.view_as_complex(x.to(work).reshape(*x.shape[:-1], -1, 2).contiguous())
    out = torch.view_as_real(xc * cis.to(xc.dtype)).flatten(-2)
    return out.to(x.dtype)
