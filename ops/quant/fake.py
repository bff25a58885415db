"""Fake quantization (quantize -> dequantize) with a straight-through round, and RTN weight quantization.

Uniform ``b``-bit quantization of each row of ``x [..., n]`` (or of each group of ``group_size`` consecutive entries):

* asymmetric: ``s = (max - min) / (2^b - 1)``, ``z = round(-min / s)``,
  ``x_q = (clamp(round(x / s) + z, 0, 2^b - 1) - z) s``
* symmetric:  ``s = max|x| / (2^{b-1} - 1)``, ``x_q = clamp(round(x / s), -2^{b-1}, 2^{b-1} - 1) s``

with ``min / max`` multiplied by ``clip_ratio``. Granularities used by OSTQuant / QuaRot: weights per output channel
(rows of ``W [out, in]``, symmetric), activations per token (rows of ``X [tokens, d]``, asymmetric), KV cache per token
and head (rows of ``[B, H, T, D]``, asymmetric). ``round`` uses a straight-through estimator, so gradients reach
``x`` and, through ``s``, the learnable transforms (as the official ``Quantizer`` does).
"""

from __future__ import annotations

import torch

from suite.errors import ConfigError


def check_bits(name: str, bits: int) -> None:
    """Raise :class:`ConfigError` unless ``2 <= bits <= 8`` (16 means 'not quantized' and is handled by callers)."""
    if not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ConfigError(f"{name}={bits!r} must be an integer bit width in 2..8 (or 16 for full precision)")


def check_group(name: str, group_size: int | None, dim: int) -> None:
    """Raise :class:`ConfigError` unless ``group_size`` is ``None`` or a positive divisor of ``dim``."""
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1 or dim % group_size):
        raise ConfigError(f"{name}={group_size!r} must be a positive divisor of the quantized dimension {dim}")


def round_ste(x: torch.Tensor) -> torch.Tensor:
    """``round(x)`` forward, identity backward."""
    return x + (torch.round(x) - x).detach()


def fake_quant(
    x: torch.Tensor, bits: int, symmetric: bool = False, group_size: int | None = None, clip_ratio: float = 1.0
) -> torch.Tensor:
    """Quantize-dequantize ``x [..., n]`` row-wise (or per group of ``group_size`` along the last dim).

    Args:
        x: Any tensor; the last dimension is quantized together.
        bits: Bit width in 2..8.
        symmetric: Symmetric (weights) or asymmetric with a zero point (activations, KV).
        group_size: Entries sharing one scale (must divide ``n``); ``None`` = the whole row.
        clip_ratio: Shrinks the range (``(0, 1]``).

    Returns:
        Same shape and dtype as ``x``.
    """
    check_bits("bits", bits)
    n = x.shape[-1]
    check_group("group_size", group_size, n)
    if not 0 < clip_ratio <= 1:
        raise ConfigError(f"clip_ratio={clip_ratio!r} must be in (0, 1]")
    shape = x.shape
    g = x.reshape(*shape[:-1], n // group_size, group_size) if group_size else x.unsqueeze(-2)
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        s = (g.abs().amax(-1, keepdim=True) * clip_ratio).clamp_min(1e-8) / qmax
        q = torch.clamp(round_ste(g / s), -qmax - 1, qmax) * s
    else:
        qmax = 2**bits - 1
        lo = (g.amin(-1, keepdim=True) * clip_ratio).clamp(max=0)
        hi = (g.amax(-1, keepdim=True) * clip_ratio).clamp(min=0)
        s = ((hi - lo) / qmax).clamp_min(1e-8)
        z = torch.round(-lo / s).detach()
        q = (torch.clamp(round_ste(g / s) + z, 0, qmax) - z) * s
    return q.reshape(shape)


def rtn_weight(
    w: torch.Tensor, bits: int, group_size: int | None = None, symmetric: bool = True, clip_search: bool = False
) -> torch.Tensor:
    """Round-to-nearest weight quantization of ``W [out, in]`` per output channel (or group).

    ``clip_search`` picks, per row, the clip ratio in ``{1.0, 0.95, ..., 0.5}`` with the least squared error (the
    official ``w_clip`` MSE search).
    """
    with torch.no_grad():
        if not clip_search:
            return fake_quant(w, bits, symmetric, group_size)
        best, best_err = None, None
        for r in torch.linspace(1.0, 0.5, 11).tolist():
            q = fake_quant(w, bits, symmetric, group_size, clip_ratio=r)
            err = (q - w).square().sum(-1, keepdim=True)
            if best is None:
                best, best_err = q, err
            else:
                take = err < best_err
                best, best_err = torch.where(take, q, best), torch.minimum(err, best_err)
        return best


class Quantizer:
    """A configured fake quantizer ``x -> fake_quant(x, ...)``; ``bits >= 16`` is the identity.

    Args:
        bits: 2..8, or 16 (off).
        symmetric: See :func:`fake_quant`.
        group_size: See :func:`fake_quant`.
        name: Config key named in errors.
    """

    def __init__(self, bits: int = 16, symmetric: bool = False, group_size: int | None = None, name: str = "bits"):
        if bits != 16:
            check_bits(name, bits)
        self.bits, self.symmetric, self.group_size = bits, symmetric, group_size
        self.enabled = True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.bits >= 16 or not self.enabled:
            return x
        return fake_quant(x, self.bits, self.symmetric, self.group_size)
