"""RoPE reference: frequencies, NTK-aware base scaling and the pairwise real rotation.

RoPE (Su et al., 2021; TULIP Sec. 3.1, Eq. 1-2) rotates the ``i``-th interleaved pair ``(x[2i], x[2i+1])`` of a
query or key at position ``m`` by the angle ``m * omega_i`` with ``omega_i = theta^(-2i/d)``, so that
``<R(m) q, R(n) k>`` depends on ``m - n`` only.
"""

from __future__ import annotations

import torch

from core.errors import check


def ntk_theta(theta: float, scaling_factor: float, new_length: int, old_length: int, head_dim: int) -> float:
    """NTK-aware RoPE base for context expansion (TULIP Sec. 3.3; official ``precompute_freqs_cis_dynamic_ntk``).

    ``theta' = theta * (s * L_new / L_old - (s - 1)) ** (d / (d - 2))``

    Args:
        theta: Base ``theta`` of the distilled student (10000).
        scaling_factor: ``s`` (the official default is 8).
        new_length: ``L_new``, the extended context.
        old_length: ``L_old``, the context the student was distilled at.
        head_dim: ``d``, the per-head dimension (even, > 2).

    Returns:
        The scaled base ``theta'``. For ``L_new = L_old`` it equals ``theta`` for every ``s``.
    """
    check(head_dim > 2 and head_dim % 2 == 0, f"RoPE head_dim={head_dim} must be even and > 2")
    check(scaling_factor > 0, f"ntk scaling_factor={scaling_factor} must be > 0")
    check(new_length > 0 and old_length > 0, f"NTK lengths must be > 0 (new={new_length}, old={old_length})")
    ratio = scaling_factor * new_length / old_length - (scaling_factor - 1)
    check(ratio > 0, f"NTK base ratio s*L_new/L_old-(s-1)={ratio:.4g} must be > 0 (s={scaling_factor})")
    return float(theta * ratio ** (head_dim / (head_dim - 2)))


def rope_frequencies(head_dim: int, theta: float = 10000.0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``omega_i = theta^(-2i/d)`` for ``i = 0 .. d/2 - 1``: ``[d/2]``. ``theta = inf`` gives all zeros."""
    check(head_dim % 2 == 0, f"RoPE head_dim={head_dim} must be even")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    return (1.0 / torch.as_tensor(theta, dtype=torch.float64) ** exponents).to(dtype)


def rope_angles(length: int, head_dim: int, theta: float = 10000.0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Angles ``m * omega_i`` for positions ``m = 0 .. length-1``: ``[length, d/2]``."""
    pos = torch.arange(length, dtype=torch.float64)
    return torch.outer(pos, rope_frequencies(head_dim, theta)).to(dtype)


def naive_apply_rope(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate each interleaved pair of ``x`` by its angle with an explicit 2x2 rotation matrix.

    Args:
        x: Queries or keys ``[B, H, T, D]``.
        angles: ``[T, D/2]`` (from :func:`rope_angles`).

    Returns:
        ``[B, H, T, D]`` with ``(x[2i], x[2i+1]) -> (x[2i] cos - x[2i+1] sin, x[2i] sin + x[2i+1] cos)``.
    """
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    rot = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)  # [T, D/2, 2, 2]
    pairs = x.reshape(*x.shape[:-1], -1, 2)  # [B, H, T, D/2, 2]
    out = torch.einsum("tpij,bhtpj->bhtpi", rot, pairs)
    return out.reshape(x.shape)
