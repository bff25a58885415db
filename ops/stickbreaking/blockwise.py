"""Blockwise stick-breaking attention that never materialises the ``T x T`` matrix.

The idea of the paper's Triton kernel (``sb_fwd``: walk key blocks from the diagonal back to position 0, carrying
``neg_log_acc = sum softplus`` of the more recent keys) in PyTorch: the outer loop runs over key blocks of ``N``
keys, newest first, for all queries at once, so at most ``T x N`` logits live at a time. For key block ``[j0, j0+N)``
and the queries ``i >= j0``::

    log A_ij = logsigmoid(z_ij) - sum_{k in block, k > j} softplus(z_ik) - acc_i   # Eq. (2)
    acc_i   += sum_{k in block} softplus(z_ik)                                   # rem_i = exp(-acc_i) at the end

The backward pass (custom ``autograd.Function``) recomputes the logits block by block in the same order. With
``dO`` and ``dRem`` the incoming gradients, ``P_ij = A_ij (dO_i . v_j)`` and ``Delta_i = dO_i . o_i = sum_j P_ij``
(the FlashAttention trick), the logit gradient is::

    dz_ij = P_ij - sigmoid(z_ij) * (sum_{r <= j} P_ir + dRem_i * rem_i),    sum_{r <= j} P_ir = Delta_i - suffix_ij

where ``suffix_ij = sum_{r > j} P_ir`` is carried across blocks like ``acc``. Memory is ``O(T (D + N))`` per head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ops.stickbreaking.naive import check_qkv


def _suffix_excl(x: torch.Tensor) -> torch.Tensor:
    """``out[..., j] = sum_{k > j} x[..., k]`` (exclusive reverse cumsum; the kernel's ``x @ L_strict``)."""
    return F.pad(x[..., 1:].flip(-1).cumsum(-1).flip(-1), (0, 1))


def _block_logits(q, k_blk, inv_temp, j0, attend_current):
    """Logits, log-weights and softplus of queries ``i >= j0`` against key block starting at ``j0``."""
    t, nb = q.shape[-2], k_blk.shape[-2]
    z = (q[..., j0:, :] @ k_blk.transpose(-1, -2)) * inv_temp  # [B, H, T - j0, N]
    rows = torch.arange(j0, t, device=q.device)[:, None]
    cols = torch.arange(j0, j0 + nb, device=q.device)[None, :]
    allowed = cols <= rows if attend_current else cols < rows
    sp = F.softplus(z).masked_fill(~allowed, 0.0)
    after = _suffix_excl(sp)  # sum over later keys of this block, [B, H, T - j0, N]
    return z, allowed, sp, after


def _forward(q, k, v, inv_temp, attend_current, block_size):
    t = q.shape[-2]
    acc = q.new_zeros(q.shape[:-1])  # [B, H, T]
    o = q.new_zeros(*q.shape[:-1], v.shape[-1])
    starts = list(range(0, t, block_size))
    for j0 in reversed(starts):
        k_blk, v_blk = k[..., j0 : j0 + block_size, :], v[..., j0 : j0 + block_size, :]
        z, allowed, sp, after = _block_logits(q, k_blk, inv_temp, j0, attend_current)
        log_a = (F.logsigmoid(z) - after - acc[..., j0:, None]).masked_fill(~allowed, float("-inf"))
        o[..., j0:, :] += log_a.exp() @ v_blk
        acc[..., j0:] += sp.sum(-1)
    return o, torch.exp(-acc)


class _StickBreaking(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, inv_temp, attend_current, block_size):
        with torch.no_grad():
            o, rem = _forward(q, k, v, inv_temp, attend_current, block_size)
        ctx.save_for_backward(q, k, v, o, rem)
        ctx.cfg = (inv_temp, attend_current, block_size)
        return o, rem

    @staticmethod
    def backward(ctx, d_o, d_rem):
        q, k, v, o, rem = ctx.saved_tensors
        inv_temp, attend_current, block_size = ctx.cfg
        t = q.shape[-2]
        d_o = torch.zeros_like(o) if d_o is None else d_o.to(o.dtype)
        d_rem = torch.zeros_like(rem) if d_rem is None else d_rem.to(rem.dtype)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta = (d_o * o).sum(-1)  # [B, H, T]
        rem_term = d_rem * rem
        acc = torch.zeros_like(rem)  # softplus of more recent keys
        acc_p = torch.zeros_like(rem)  # P of more recent keys
        for j0 in reversed(range(0, t, block_size)):
            j1 = min(j0 + block_size, t)
            k_blk, v_blk = k[..., j0:j1, :], v[..., j0:j1, :]
            z, allowed, sp, after = _block_logits(q, k_blk, inv_temp, j0, attend_current)
            a = (F.logsigmoid(z) - after - acc[..., j0:, None]).masked_fill(~allowed, float("-inf")).exp()
            d_o_rows = d_o[..., j0:, :]
            p = a * (d_o_rows @ v_blk.transpose(-1, -2))  # [B, H, T - j0, N]
            suffix = _suffix_excl(p) + acc_p[..., j0:, None]
            prefix = delta[..., j0:, None] - suffix
            dz = (p - torch.sigmoid(z) * (prefix + rem_term[..., j0:, None])).masked_fill(~allowed, 0.0) * inv_temp
            dq[..., j0:, :] += dz @ k_blk
            dk[..., j0:j1, :] += dz.transpose(-1, -2) @ q[..., j0:, :]
            dv[..., j0:j1, :] += a.transpose(-1, -2) @ d_o_rows
            acc[..., j0:] += sp.sum(-1)
            acc_p[..., j0:] += p.sum(-1)
        return dq, dk, dv, None, None, None


def blockwise_stickbreaking(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    inv_temp: float | None = None,
    attend_current: bool = False,
    block_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stick-breaking attention online over key blocks (same contract as :func:`naive_stickbreaking`).

    Args:
        q: Queries ``[B, H, T, D]``.
        k: Keys ``[B, H, T, D]``.
        v: Values ``[B, H, T, Dv]``.
        inv_temp: Logit scale, default ``D ** -0.5``.
        attend_current: Include ``j = i``.
        block_size: Keys per block ``N`` (a power of two); peak extra memory is ``O(B H T N)``.

    Returns:
        ``(o [B, H, T, Dv], rem [B, H, T])`` in ``v``'s dtype (computed in float32, float64 stays float64).
    """
    check_qkv(q, k, v)
    if not isinstance(block_size, int) or block_size < 1 or block_size & (block_size - 1):
        raise ValueError(f"block_size={block_size!r} must be a positive power of two")
    inv_temp = q.shape[-1] ** -0.5 if inv_temp is None else float(inv_temp)
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    o, rem = _StickBreaking.apply(q.to(dt), k.to(dt), v.to(dt), inv_temp, attend_current, block_size)
    return o.to(v.dtype), rem.to(v.dtype)
