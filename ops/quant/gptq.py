"""GPTQ (Frantar et al., 2023) weight quantization, as OSTQuant step 4 uses it after folding the transforms.

Minimises ``||W X - Q X||^2`` column by column with the Hessian ``H = 2 X X^T`` of the layer inputs: quantize
column ``i``, then spread its error over the not-yet-quantized columns,
``W[:, j] -= (w_i - q_i) / [H^-1]_ii * [H^-1]_ij`` (the OBS update), and remove ``i`` from ``H^-1``.

* :func:`gptq_naive` does exactly that, updating ``H^-1`` by Gaussian elimination after each column (readable).
* :func:`gptq` is the fast form of the GPTQ paper: the upper Cholesky factor of ``H^-1`` gives every needed row at
  once, and updates are applied lazily in blocks of ``block_size`` columns.

Both use ``percdamp * mean(diag H)`` damping and zero the columns of dead inputs (``H_ii = 0``), as the reference
implementation does. Group scales are computed from the (already updated) weights when a group starts, with the
quantizer of :func:`ops.quant.fake.fake_quant` (symmetric: the signed grid ``[-2^{b-1}, 2^{b-1} - 1]`` with
``s = max(-min / 2^{b-1}, max / (2^{b-1} - 1))``, official). ``clip_search=True`` is the official ``w_clip``: each
row's (group's) scale is the clip ratio of :func:`ops.quant.fake.clip_ratios` with the least ``sum |q - w|^norm``
on the weights it is computed from (the GPTQ / QuaRot quantizer's ``find_params`` with ``mse=True``).
"""

from __future__ import annotations

import torch

from core.errors import ConfigError
from ops.quant.fake import check_bits, check_group, check_sym_scale, clip_ratios, symmetric_scale


def _prepare(w: torch.Tensor, h: torch.Tensor, percdamp: float) -> tuple[torch.Tensor, torch.Tensor]:
    w, h = w.clone(), h.clone()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    h += percdamp * torch.mean(torch.diag(h)) * torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    return w, h


def _qparams_at(group: torch.Tensor, bits: int, symmetric: bool, ratio: float, sym_scale: str):
    """``(scale, zero)`` per row of ``group [out, g]`` with the range shrunk by ``ratio`` (as :func:`fake_quant`)."""
    lo, hi = (group.amin(-1) * ratio).clamp(max=0), (group.amax(-1) * ratio).clamp(min=0)
    if symmetric:
        return symmetric_scale(lo, hi, bits, sym_scale), torch.zeros_like(lo)
    s = ((hi - lo) / (2**bits - 1)).clamp_min(1e-8)
    return s, torch.round(-lo / s)


def _qparams(
    group: torch.Tensor,
    bits: int,
    symmetric: bool,
    clip: tuple[str, float] | None = None,
    sym_scale: str = "signed",
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Per-row ``(scale, zero, qmin, qmax)`` of a group ``[out, g]``, exactly as :func:`fake_quant` derives them;
    ``clip = (grid, norm)`` searches the clip ratio per row (least ``sum |q - w|^norm``, first ratio wins ties)."""
    qmin, qmax = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if symmetric else (0, 2**bits - 1)
    s, z = _qparams_at(group, bits, symmetric, 1.0, sym_scale)
    if clip is not None:
        grid, norm = clip
        best = None
        for r in clip_ratios(grid):
            s1, z1 = _qparams_at(group, bits, symmetric, r, sym_scale)
            err = (_quant_col(group, (s1[:, None], z1[:, None], qmin, qmax)) - group).abs().pow(norm).sum(-1)
            if best is None:
                best, s, z = err, s1, z1
            else:
                take = err < best
                best, s, z = torch.where(take, err, best), torch.where(take, s1, s), torch.where(take, z1, z)
    return s, z, qmin, qmax


def _quant_col(w_col: torch.Tensor, qp: tuple[torch.Tensor, torch.Tensor, int, int]) -> torch.Tensor:
    s, z, qmin, qmax = qp
    return (torch.clamp(torch.round(w_col / s) + z, qmin, qmax) - z) * s


def _clip(clip_search: bool, clip_grid: str, clip_norm: float, sym_scale: str) -> tuple[str, float] | None:
    check_sym_scale(sym_scale)
    clip_ratios(clip_grid)  # validates the grid name
    if clip_norm <= 0:
        raise ConfigError(f"clip_norm={clip_norm!r} must be > 0")
    return (clip_grid, clip_norm) if clip_search else None


def gptq_naive(
    w: torch.Tensor,
    h: torch.Tensor,
    bits: int,
    group_size: int | None = None,
    symmetric: bool = True,
    percdamp: float = 0.01,
    clip_search: bool = False,
    clip_grid: str = "official",
    clip_norm: float = 2.4,
    sym_scale: str = "signed",
) -> torch.Tensor:
    """Column-by-column GPTQ with explicit ``H^-1`` updates. ``W [out, in]``, ``H [in, in]`` -> ``Q [out, in]``."""
    check_bits("w_bits", bits)
    n = w.shape[1]
    check_group("w_group_size", group_size, n)
    clip = _clip(clip_search, clip_grid, clip_norm, sym_scale)
    w, h = _prepare(w, h, percdamp)
    hinv = torch.linalg.inv(h)
    q = torch.zeros_like(w)
    qp = _qparams(w, bits, symmetric, clip, sym_scale)
    for i in range(n):
        if group_size and i % group_size == 0:
            qp = _qparams(w[:, i : i + group_size], bits, symmetric, clip, sym_scale)
        q[:, i] = _quant_col(w[:, i], qp)
        err = (w[:, i] - q[:, i]) / hinv[i, i]
        w[:, i + 1 :] -= err[:, None] * hinv[i, i + 1 :][None, :]
        hinv = hinv - hinv[:, i : i + 1] @ hinv[i : i + 1, :] / hinv[i, i]
    return q


def gptq(
    w: torch.Tensor,
    h: torch.Tensor,
    bits: int,
    group_size: int | None = None,
    symmetric: bool = True,
    percdamp: float = 0.01,
    block_size: int = 128,
    clip_search: bool = False,
    clip_grid: str = "official",
    clip_norm: float = 2.4,
    sym_scale: str = "signed",
) -> torch.Tensor:
    """Blocked Cholesky GPTQ (the fast path of :func:`gptq_naive`). ``W [out, in]``, ``H [in, in]`` -> ``Q``."""
    check_bits("w_bits", bits)
    n = w.shape[1]
    check_group("w_group_size", group_size, n)
    clip = _clip(clip_search, clip_grid, clip_norm, sym_scale)
    w, h = _prepare(w, h, percdamp)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    q = torch.zeros_like(w)
    qp = _qparams(w, bits, symmetric, clip, sym_scale)
    if group_size:  # blocks hold whole groups, so a group's scale sees all earlier updates (as in gptq_naive)
        block_size = max(group_size, block_size // group_size * group_size)
    for b0 in range(0, n, block_size):
        b1 = min(b0 + block_size, n)
        w1, q1, e1 = w[:, b0:b1].clone(), torch.zeros_like(w[:, b0:b1]), torch.zeros_like(w[:, b0:b1])
        hb = hinv[b0:b1, b0:b1]
        for j in range(b1 - b0):
            i = b0 + j
            if group_size and i % group_size == 0:
                qp = _qparams(w1[:, j : j + group_size], bits, symmetric, clip, sym_scale)
            q1[:, j] = _quant_col(w1[:, j], qp)
            e1[:, j] = (w1[:, j] - q1[:, j]) / hb[j, j]
            w1[:, j + 1 :] -= e1[:, j : j + 1] @ hb[j : j + 1, j + 1 :]
        q[:, b0:b1] = q1
        w[:, b1:] -= e1 @ hinv[b0:b1, b1:]
    return q


def input_hessian(x: torch.Tensor) -> torch.Tensor:
    """``H = 2 X^T X / N`` from layer inputs ``x [..., in]``."""
    x = x.reshape(-1, x.shape[-1]).double()
    return 2 * x.T @ x / x.shape[0]
