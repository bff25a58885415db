"""Blockwise stick-breaking attention that never materialises the ``T x T`` matrix.

The idea of the paper's Triton kernel (``sb_fwd``: walk key blocks from the diagonal back to position 0, carrying
``neg_log_acc = sum softplus`` of the more recent keys) in PyTorch: the outer loop runs over key blocks of ``N``
keys, newest first; inside it, the queries ``i >= j0`` are taken in row tiles of ``M`` queries, so at most ``M x N``
logits (per batch and head) live at a time. For key block ``[j0, j0+N)`` and a query ``i >= j0``::

    log A_ij = logsigmoid(z_ij) - sum_{k in block, k > j} softplus(z_ik) - acc_i   # Eq. (2)
    acc_i   += sum_{k in block} softplus(z_ik)                                   # rem_i = exp(-acc_i) at the end

The backward pass (custom ``autograd.Function``) saves only ``q, k, v, o, rem`` and recomputes the logits tile by tile
in the same order. With ``dO`` and ``dRem`` the incoming gradients, ``P_ij = A_ij (dO_i . v_j)`` and
``Delta_i = dO_i . o_i = sum_j P_ij`` (the FlashAttention trick), the logit gradient is::

    dz_ij = P_ij - sigmoid(z_ij) * (sum_{r <= j} P_ir + dRem_i * rem_i),    sum_{r <= j} P_ir = Delta_i - suffix_ij

where ``suffix_ij = sum_{r > j} P_ir`` is carried across key blocks like ``acc``. Memory is ``O(T D + M N)`` per
head: the saved state is the inputs and outputs only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ops.stickbreaking.naive import check_qkv


def _suffix_excl(x: torch.Tensor) -> torch.Tensor:
    """``out[..., j] = sum_{k > j} x[..., k]`` (exclusive reverse cumsum; the kernel's ``x @ L_strict``)."""
    return F.pad(x[..., 1:].flip(-1).cumsum(-1).flip(-1), (0, 1))


def _tiles(t: int, block_size: int, row_block: int):
    """Key blocks newest first and, for each, the row tiles ``[i0, i1)`` of the queries ``i >= j0``."""
    for j0 in reversed(range(0, t, block_size)):
        j1 = min(j0 + block_size, t)
        for i0 in range(j0, t, row_block):
            yield j0, j1, i0, min(i0 + row_block, t)


def _tile_logits(q_rows, k_blk, inv_temp, i0, j0, attend_current):
    """Logits, mask (``None`` when the whole tile is visible) and masked softplus of one ``M x N`` tile."""
    m, nb = q_rows.shape[-2], k_blk.shape[-2]
    z = (q_rows @ k_blk.transpose(-1, -2)) * inv_temp  # [B, H, M, N]
    sp = F.softplus(z)
    allowed = None
    if i0 < j0 + nb:  # the tile touches the diagonal
        rows = torch.arange(i0, i0 + m, device=z.device)[:, None]
        cols = torch.arange(j0, j0 + nb, device=z.device)[None, :]
        allowed = cols <= rows if attend_current else cols < rows
        sp = sp.masked_fill_(~allowed, 0.0)
    return z, allowed, sp


def _log_weights(z, allowed, sp, acc_rows):
    """``log A`` of one tile (``-inf`` where masked)."""
    log_a = F.logsigmoid(z).sub_(_suffix_excl(sp)).sub_(acc_rows[..., None])
    return log_a if allowed is None else log_a.masked_fill_(~allowed, float("-inf"))


def _forward(q, k, v, inv_temp, attend_current, block_size, row_block):
    t = q.shape[-2]
    acc = q.new_zeros(q.shape[:-1])  # [B, H, T]
    o = q.new_zeros(*q.shape[:-1], v.shape[-1])
    for j0, j1, i0, i1 in _tiles(t, block_size, row_block):
        z, allowed, sp = _tile_logits(q[..., i0:i1, :], k[..., j0:j1, :], inv_temp, i0, j0, attend_current)
        a = _log_weights(z, allowed, sp, acc[..., i0:i1]).exp_()
        o[..., i0:i1, :] += a @ v[..., j0:j1, :]
        acc[..., i0:i1] += sp.sum(-1)
    return o, torch.exp(-acc)


class _StickBreaking(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, inv_temp, attend_current, block_size, row_block):
        with torch.no_grad():
            o, rem = _forward(q, k, v, inv_temp, attend_current, block_size, row_block)
        ctx.save_for_backward(q, k, v, o, rem)
        ctx.cfg = (inv_temp, attend_current, block_size, row_block)
        return o, rem

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, d_rem):
        q, k, v, o, rem = ctx.saved_tensors
        inv_temp, attend_current, block_size, row_block = ctx.cfg
        t = q.shape[-2]
        d_o = torch.zeros_like(o) if d_o is None else d_o.to(o.dtype)
        d_rem = torch.zeros_like(rem) if d_rem is None else d_rem.to(rem.dtype)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta_rem = (d_o * o).sum(-1) + d_rem * rem  # Delta_i + dRem_i rem_i
        acc = torch.zeros_like(rem)  # softplus of more recent keys
        acc_p = torch.zeros_like(rem)  # P of more recent keys
        for j0, j1, i0, i1 in _tiles(t, block_size, row_block):
            k_blk, v_blk, q_rows, d_o_rows = k[..., j0:j1, :], v[..., j0:j1, :], q[..., i0:i1, :], d_o[..., i0:i1, :]
            z, allowed, sp = _tile_logits(q_rows, k_blk, inv_temp, i0, j0, attend_current)
            a = _log_weights(z, allowed, sp, acc[..., i0:i1]).exp_()
            p = a * (d_o_rows @ v_blk.transpose(-1, -2))  # [B, H, M, N]
            # prefix + rem term = Delta_i + dRem_i rem_i - suffix_ij
            pre = _suffix_excl(p).add_(acc_p[..., i0:i1, None]).neg_().add_(delta_rem[..., i0:i1, None])
            dz = p.sub(torch.sigmoid(z).mul_(pre))
            if allowed is not None:
                dz.masked_fill_(~allowed, 0.0)
            dz.mul_(inv_temp)
            dq[..., i0:i1, :] += dz @ k_blk
            dk[..., j0:j1, :] += dz.transpose(-1, -2) @ q_rows
            dv[..., j0:j1, :] += a.transpose(-1, -2) @ d_o_rows
            acc[..., i0:i1] += sp.sum(-1)
            acc_p[..., i0:i1] += p.sum(-1)
        return dq, dk, dv, None, None, None, None


def blockwise_stickbreaking(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    inv_temp: float | None = None,
    attend_current: bool = False,
    block_size: int = 64,
    row_block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stick-breaking attention online over key blocks (same contract as :func:`naive_stickbreaking`).

    Args:
        q: Queries ``[B, H, T, D]``.
        k: Keys ``[B, H, T, D]``.
        v: Values ``[B, H, T, Dv]``.
        inv_temp: Logit scale, default ``D ** -0.5``.
        attend_current: Include ``j = i``.
        block_size: Keys per block ``N`` (a power of two).
        row_block: Queries per tile ``M`` (a power of two), default ``max(block_size, 256)``; peak extra memory is
            ``O(B H M N)`` on top of the ``O(B H T D)`` inputs, outputs and gradients.

    Returns:
        ``(o [B, H, T, Dv], rem [B, H, T])`` in ``v``'s dtype (computed in float32, float64 stays float64).
    """
    check_qkv(q, k, v)
    row_block = max(block_size, 256) if row_block is None else row_block
    for name, val in (("block_size", block_size), ("row_block", row_block)):
        if not isinstance(val, int) or val < 1 or val & (val - 1):
            raise ValueError(f"{name}={val!r} must be a positive power of two")
    inv_temp = q.shape[-1] ** -0.5 if inv_temp is None else float(inv_temp)
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    o, rem = _StickBreaking.apply(q.to(dt), k.to(dt), v.to(dt), inv_temp, attend_current, block_size, row_block)
    return o.to(v.dtype), rem.to(v.dtype)
