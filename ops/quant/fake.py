"""Fake quantization (quantize -> dequantize) with a straight-through round, and RTN weight quantization.

Uniform ``b``-bit quantization of each row of ``x [..., n]`` (or of each group of ``group_size`` consecutive entries):

* asymmetric: ``s = (max - min) / (2^b - 1)``, ``z = round(-min / s)``,
  ``x_q = (clamp(round(x / s) + z, 0, 2^b - 1) - z) s``
* symmetric (signed grid ``[-2^{b-1}, 2^{b-1} - 1]``, e.g. ``[-8, 7]`` at 4 bits):
  ``s = max(-min / 2^{b-1}, max / (2^{b-1} - 1))``, ``x_q = clamp(round(x / s), -2^{b-1}, 2^{b-1} - 1) s``
  (``min <= 0 <= max``). This is the official OSTQuant weight quantizer: a row dominated by negative values uses the
  level ``-2^{b-1}`` and gets a finer grid than ``max|x| / (2^{b-1} - 1)`` would give. ``sym_scale="absmax"`` keeps
  the older ``s = max|x| / (2^{b-1} - 1)`` (the level ``-2^{b-1}`` is then never used).

with ``min / max`` multiplied by ``clip_ratio``. Granularities used by OSTQuant / QuaRot: weights per output channel
(rows of ``W [out, in]``, symmetric), activations per token (rows of ``X [tokens, d]``, asymmetric), KV cache per token
and head (rows of ``[B, H, T, D]``, asymmetric). ``round`` uses a straight-through estimator, so gradients reach
``x`` and, through ``s``, the learnable transforms (as the official ``Quantizer`` does).
"""

from __future__ import annotations

import torch

from core.errors import ConfigError

SYM_SCALES = ("signed", "absmax")
CLIP_GRIDS = ("official", "coarse")


def check_bits(name: str, bits: int) -> None:
    """Raise :class:`ConfigError` unless ``2 <= bits <= 8`` (16 means 'not quantized' and is handled by callers)."""
    if not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ConfigError(f"{name}={bits!r} must be an integer bit width in 2..8 (or 16 for full precision)")


def check_group(name: str, group_size: int | None, dim: int) -> None:
    """Raise :class:`ConfigError` unless ``group_size`` is ``None`` or a positive divisor of ``dim``."""
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1 or dim % group_size):
        raise ConfigError(f"{name}={group_size!r} must be a positive divisor of the quantized dimension {dim}")


def check_sym_scale(sym_scale: str) -> None:
    """Raise :class:`ConfigError` unless ``sym_scale`` is one of :data:`SYM_SCALES`."""
    if sym_scale not in SYM_SCALES:
        raise ConfigError(f"sym_scale={sym_scale!r} must be one of {list(SYM_SCALES)}")


def symmetric_scale(lo: torch.Tensor, hi: torch.Tensor, bits: int, sym_scale: str = "signed") -> torch.Tensor:
    """Scale of the signed ``bits``-bit grid ``[-2^{b-1}, 2^{b-1} - 1]`` for a range ``lo <= 0 <= hi``.

    ``signed`` (official OSTQuant): ``max(-lo / 2^{b-1}, hi / (2^{b-1} - 1))``; ``absmax``: ``max(-lo, hi) /
    (2^{b-1} - 1)``. Clamped below at ``1e-8`` (an all-zero row).
    """
    qmax = 2 ** (bits - 1) - 1
    if sym_scale == "absmax":
        return torch.maximum(-lo, hi).clamp_min(1e-8) / qmax
    return torch.maximum(-lo / (qmax + 1), hi / qmax).clamp_min(1e-8)


def clip_ratios(grid: str = "official") -> list[float]:
    """Clip ratios of the weight-clipping search.

    ``official``: the 80 ratios ``1 - i / 100``, ``i = 0..79`` (``1.00, 0.99, ..., 0.21``; the GPTQ / QuaRot /
    OSTQuant quantizer's ``grid=100, maxshrink=0.8``); ``coarse``: ``1.0, 0.95, ..., 0.5`` (11 ratios).
    """
    if grid not in CLIP_GRIDS:
        raise ConfigError(f"clip_grid={grid!r} must be one of {list(CLIP_GRIDS)}")
    if grid == "coarse":
        return [1.0 - 0.05 * i for i in range(11)]
    return [1.0 - i / 100 for i in range(80)]


def round_ste(x: torch.Tensor) -> torch.Tensor:
    """``round(x)`` forward, identity backward."""
    return x + (torch.round(x) - x).detach()


def fake_quant(
    x: torch.Tensor,
    bits: int,
    symmetric: bool = False,
    group_size: int | None = None,
    clip_ratio: float = 1.0,
    sym_scale: str = "signed",
) -> torch.Tensor:
    """Quantize-dequantize ``x [..., n]`` row-wise (or per group of ``group_size`` along the last dim).

    Args:
        x: Any tensor; the last dimension is quantized together.
        bits: Bit width in 2..8.
        symmetric: Symmetric (weights) or asymmetric with a zero point (activations, KV).
        group_size: Entries sharing one scale (must divide ``n``); ``None`` = the whole row.
        clip_ratio: Shrinks the range (``(0, 1]``).
        sym_scale: Symmetric scale rule, ``signed`` (official) or ``absmax`` (see module docstring).

    Returns:
        Same shape and dtype as ``x``.
    """
    check_bits("bits", bits)
    n = x.shape[-1]
    check_group("group_size", group_size, n)
    if not 0 < clip_ratio <= 1:
        raise ConfigError(f"clip_ratio={clip_ratio!r} must be in (0, 1]")
    check_sym_scale(sym_scale)
    shape = x.shape
    g = x.reshape(*shape[:-1], n // group_size, group_size) if group_size else x.unsqueeze(-2)
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        lo = (g.amin(-1, keepdim=True) * clip_ratio).clamp(max=0)
        hi = (g.amax(-1, keepdim=True) * clip_ratio).clamp(min=0)
        s = symmetric_scale(lo, hi, bits, sym_scale)
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
    w: torch.Tensor,
    bits: int,
    group_size: int | None = None,
    symmetric: bool = True,
    clip_search: bool = False,
    clip_grid: str = "official",
    clip_norm: float = 2.4,
    sym_scale: str = "signed",
) -> torch.Tensor:
    """Round-to-nearest weight quantization of ``W [out, in]`` per output channel (or group).

    ``clip_search`` (the official ``w_clip``) picks, per row (group), the clip ratio of :func:`clip_ratios`
    (``clip_grid``) with the least error ``sum |q - w|^clip_norm`` (official: 80 ratios, exponent 2.4; the first
    ratio wins ties, so 1.0 is kept unless a smaller one is strictly better).
    """
    check_sym_scale(sym_scale)
    if clip_norm <= 0:
        raise ConfigError(f"clip_norm={clip_norm!r} must be > 0")
    with torch.no_grad():
        if not clip_search:
            return fake_quant(w, bits, symmetric, group_size, sym_scale=sym_scale)
        n = w.shape[-1]
        check_group("group_size", group_size, n)
        shape = w.shape
        g = w.reshape(*shape[:-1], n // group_size, group_size) if group_size else w.unsqueeze(-2)
        lo0, hi0 = g.amin(-1, keepdim=True).clamp(max=0), g.amax(-1, keepdim=True).clamp(min=0)
        best, best_err = None, None
        for r in clip_ratios(clip_grid):  # = fake_quant(g, ..., clip_ratio=r) without the STE bookkeeping
            lo, hi = lo0 * r, hi0 * r
            if symmetric:
                qmax = 2 ** (bits - 1) - 1
                sc = symmetric_scale(lo, hi, bits, sym_scale)
                q = torch.clamp(torch.round(g / sc), -qmax - 1, qmax) * sc
            else:
                qmax = 2**bits - 1
                sc = ((hi - lo) / qmax).clamp_min(1e-8)
                z = torch.round(-lo / sc)
                q = (torch.clamp(torch.round(g / sc) + z, 0, qmax) - z) * sc
            err = (q - g).abs().pow(clip_norm).sum(-1, keepdim=True)
            if best is None:
                best, best_err = q, err
            else:
                take = err < best_err
                best, best_err = torch.where(take, q, best), torch.where(take, err, best_err)
        return best.reshape(shape)


class Quantizer:
    """A configured fake quantizer ``x -> fake_quant(x, ...)``; ``bits >= 16`` is the identity.

    Args:
        bits: 2..8, or 16 (off).
        symmetric: See :func:`fake_quant`.
        group_size: See :func:`fake_quant`.
        name: Config key named in errors.
        sym_scale: See :func:`fake_quant` (symmetric only).
    """

    def __init__(
        self,
        bits: int = 16,
        symmetric: bool = False,
        group_size: int | None = None,
        name: str = "bits",
        sym_scale: str = "signed",
    ):
        if bits != 16:
            check_bits(name, bits)
        check_sym_scale(sym_scale)
        self.bits, self.symmetric, self.group_size, self.sym_scale = bits, symmetric, group_size, sym_scale
        self.enabled = True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.bits >= 16 or not self.enabled:
            return x
        return fake_quant(x, self.bits, self.symmetric, self.group_size, sym_scale=self.sym_scale)
