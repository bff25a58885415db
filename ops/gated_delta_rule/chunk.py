"""Chunked parallel gated delta rule: the WY / UT-transform algorithm of Gated DeltaNet (Yang et al., ICLR 2025, §3.3).

Inside a chunk of ``C`` tokens, with ``b_r = sum_{s<=r} g_s`` the local cumulative log-decay and
``Gamma_rs = exp(b_r - b_s)`` for ``r >= s`` (0 otherwise), the chunk's rows ``Q`` (scaled), ``K``, ``V``,
``beta`` and incoming state ``S`` (``[K, V]``, the transpose of the paper's ``S``) give (Eqs. (8)-(9) with the gated
WY representation of §3.3; fla ``naive_chunk_gated_delta_rule``)::

    A     = strictly_lower(diag(beta) (K K^T) * Gamma)          # C x C
    T     = (I + A)^{-1}                                         # UT transform (forward substitution)
    W     = T diag(beta) diag(e^b) K                             # "k_cumdecay"
    U     = T diag(beta) V                                       # pseudo-values
    V_new = U - W S
    O     = diag(e^b) Q S + ((Q K^T) * Gamma * lower_incl) V_new
    S'    = e^{b_C} S + (diag(e^{b_C - b}) K)^T V_new

``Gamma`` is always formed from differences ``b_r - b_s`` with ``r >= s`` (masked *before* ``exp``), never from
``e^{b}`` and ``e^{-b}`` separately, which overflows for long chunks with strong decay.
The intra-chunk work is batched over all chunks; only the ``T / C`` state hand-offs (two small matmuls per chunk) run
in a Python loop. The whole algorithm is one autograd node with a hand-written backward (:class:`_ChunkGatedDeltaRule`).
A sequence that is not a multiple of ``C`` is zero-padded with ``beta = 0`` and ``g = 0`` (no write, no decay), so
the final state is exact.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _check_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None,
    initial_state: torch.Tensor | None,
) -> None:
    if q.dim() != 4:
        raise ValueError(f"q must be [B, T, H, K], got shape {tuple(q.shape)}")
    if k.shape != q.shape:
        raise ValueError(f"k shape {tuple(k.shape)} must equal q shape {tuple(q.shape)} (same head dim K)")
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be [B, T, H, V] with [B, T, H] = {tuple(q.shape[:3])}, got {tuple(v.shape)}")
    if beta.shape != q.shape[:3]:
        raise ValueError(f"beta must be [B, T, H] = {tuple(q.shape[:3])}, got {tuple(beta.shape)}")
    if g is not None and g.shape != q.shape[:3]:
        raise ValueError(f"g must be [B, T, H] = {tuple(q.shape[:3])}, got {tuple(g.shape)}")
    if initial_state is not None:
        want = (q.shape[0], q.shape[2], q.shape[3], v.shape[3])
        if tuple(initial_state.shape) != want:
            raise ValueError(f"initial_state must be [B, H, K, V] = {want}, got {tuple(initial_state.shape)}")


def _unit_lower_inverse(a: torch.Tensor, base: int = 16) -> torch.Tensor:
    """``(I + strict_lower(a))^{-1}`` for a batch ``[..., C, C]`` (``C`` a power of two), by blocks.

    The diagonal ``base x base`` blocks are inverted by one batched triangular solve; then, doubling the block size,
    ``[[T11, 0], [A21, T22]]^{-1}`` has the off-diagonal block ``-T22 A21 T11``: two small batched matmuls per level.
    Only the strict lower triangle of ``a`` is read. On CPU this is several times faster than one ``C x C``
    triangular solve per matrix (LAPACK's ``trsm`` on small matrices), and with ``T`` stored the backward's
    transposed solve becomes a matmul.
    """
    c = a.shape[-1]
    a = a.reshape(-1, c, c).contiguous()
    m = a.shape[0]
    s = min(base, c)
    eye = torch.eye(s, dtype=a.dtype, device=a.device)

    def blocks(x: torch.Tensor, size: int, step: int, offset: int) -> torch.Tensor:
        # the [M, C / step, size, size] blocks of x at (offset + j * step * (C + 1)): diagonal blocks or just below
        return x.as_strided((m, c // step, size, size), (c * c, step * (c + 1), c, 1), x.storage_offset() + offset)

    t = a.new_zeros(m, c, c)
    diag = blocks(a, s, s, 0).reshape(-1, s, s)
    inv = torch.linalg.solve_triangular(diag, eye.expand(diag.shape), upper=False, unitriangular=True)
    blocks(t, s, s, 0).copy_(inv.view(m, c // s, s, s))
    while s < c:
        t11, t22 = blocks(t, s, 2 * s, 0), blocks(t, s, 2 * s, s * (c + 1))
        blocks(t, s, 2 * s, s * c).copy_(torch.matmul(torch.matmul(t22, blocks(a, s, 2 * s, s * c)), t11).neg_())
        s *= 2
    return t


def _state_forward(hs, v_new, w, k, e_tail, decay):
    """The inter-chunk state hand-off (fla's ``chunk_fwd_h``), chunk-major ``[N, B, H, ...]``, in place::

        v_i     = u_i - w_i h_i                 (v_new holds u on entry; w = None without the delta rule)
        h_{i+1} = d_i h_i + k_i^T v_i           (k_i = diag(e^{b_C - b}) K, formed per chunk; d_i = e^{b_C})

    ``hs [N + 1, B, H, K, V]`` holds ``h_0`` on entry and every ``h_i`` on return. Only these two small products per
    chunk run sequentially; everything else is batched over all chunks.
    """
    k_dec = k.new_empty(k.shape[1:]).flatten(0, 1)  # per-chunk scratch
    for i in range(v_new.shape[0]):
        h = hs[i].flatten(0, 1)
        v_i = v_new[i].flatten(0, 1)
        if w is not None:
            v_i.baddbmm_(w[i].flatten(0, 1), h, alpha=-1.0)
        torch.mul(k[i].flatten(0, 1), e_tail[i].reshape(-1, e_tail.shape[-1], 1), out=k_dec)
        h_next = hs[i + 1].flatten(0, 1)
        torch.mul(h, decay[i].reshape(-1, 1, 1), out=h_next).baddbmm_(k_dec.transpose(-1, -2), v_i)


def _state_backward(dhs, dh, dv, w, k, e_tail, decay):
    """Backward of :func:`_state_forward` (fla's ``chunk_bwd_dh``), walking the chunks in reverse::

        dv_i += k_i dh_{i+1}                    dh_i = q_i^T do_i + d_i dh_{i+1} - w_i^T dv_i

    ``dhs [N, B, H, K, V]`` holds ``q_i^T do_i`` on entry and ``dh_{i+1}`` (the gradient of the state leaving chunk
    ``i``) on return; ``dv`` holds ``a_i^T do_i`` on entry and the full ``dv_i`` on return. Returns ``dh_0``.
    """
    k_dec = k.new_empty(k.shape[1:]).flatten(0, 1)
    dh = dh.flatten(0, 1)
    spare = torch.empty_like(dh)
    for i in reversed(range(dv.shape[0])):
        dv_i = dv[i].flatten(0, 1)
        torch.mul(k[i].flatten(0, 1), e_tail[i].reshape(-1, e_tail.shape[-1], 1), out=k_dec)
        dv_i.baddbmm_(k_dec, dh)
        dq_i = dhs[i].flatten(0, 1)
        if w is not None:
            torch.baddbmm(dq_i, w[i].flatten(0, 1).transpose(-1, -2), dv_i, alpha=-1.0, out=spare)
        else:
            spare.copy_(dq_i)
        spare.addcmul_(dh, decay[i].reshape(-1, 1, 1))
        dq_i.copy_(dh)
        dh, spare = spare, dh
    return dh.view(dhs.shape[1:])


def _rowdot_into(out: torch.Tensor, x: torch.Tensor, y: torch.Tensor, scratch: torch.Tensor, alpha: float = 1.0):
    """``out += alpha * (x * y).sum(-1)``, the product written into ``scratch`` (reused: no fresh allocation)."""
    out.add_(torch.mul(x, y, out=scratch[: x.numel()].view(x.shape)).sum(-1), alpha=alpha)


def _rowcol_into(out: torch.Tensor, x: torch.Tensor, y: torch.Tensor, scratch: torch.Tensor):
    """``out += G.sum(-1) - G.sum(-2)`` with ``G = x * y`` (``[..., C, C]``) written into ``scratch``."""
    g = torch.mul(x, y, out=scratch[: x.numel()].view(x.shape))
    out.add_(g.sum(-1)).sub_(g.sum(-2))


class _ChunkGatedDeltaRule(torch.autograd.Function):
    """The whole chunked algorithm as one autograd node with a hand-written backward (module docstring for the
    forward). Inputs are chunk-major ``[N, B, H, C, ...]`` (``q`` unscaled; ``scale`` is applied inside) plus
    ``h0 [B, H, K, V]``.

    Forward, batched over all chunks except the state hand-off (:func:`_state_forward`), with the UT transform as
    the stored inverse ``T = (I + A)^{-1}`` (:func:`_unit_lower_inverse`): ``W = T diag(beta e^b) K``,
    ``U = T diag(beta) V`` (overwritten by ``V_new = U - W S``) and ``O = diag(scale e^b) (Q S) + attn V_new``.

    Backward, per chunk, with ``G = dGamma * Gamma`` collected from both masked products (``dattn * attn`` and
    ``dA * A``, so ``Q K^T`` and ``Kb K^T`` need not be kept), ``dO' = diag(scale e^b) dO`` and ``dU = dV_new``
    (the full gradient of the pseudo-values after the state backward)::

        dR_V = T^T dU                   dR_K = T^T dW = -dR_V S^T         (dW = -dU S^T)
        dA = -strict_lower(dR_K W^T + dR_V U^T) = -strict_lower(dR_V V_new^T)
        dQ = scale (dattn * Gamma) K + dO' S^T
        dK = scale (dattn * Gamma)^T Q + (dA * Gamma)^T Kb + diag(beta) dKb + diag(e^{b_C - b}) dk_dec
        dKb = (dA * Gamma) K + diag(e^b) dR_K          dV = diag(beta) dR_V
        db_r += sum_s G_rs - sum_s G_sr  (+ the e^b, e^{b_C - b}, e^{b_C} terms);  dg = reverse cumsum of db

    The two identities on the second and third line (``V_new = U - W S`` per chunk) replace four ``C``-sized
    products of the plain chain rule by two, and mean ``U`` need not be kept. Compared with autograd through the
    composed ops this also avoids the ``[C, C]`` temporaries of the two masked products and most fresh full-size
    buffers: products accumulate in place (``baddbmm_``, ``addcmul_``), the state gradients overwrite ``Q^T dO'``, one
    scratch buffer serves every row-wise product, and the ``[C, C]`` buffer of ``dattn`` is reused for ``dA``. On
    CPU a fresh multi-MB buffer costs page faults once the allocator has returned the memory between calls, so the
    peak size matters beside the flops. ``tests/ops/test_gated_delta_rule.py`` checks it against the token-by-token
    recurrence in float64.
    """

    @staticmethod
    def forward(ctx, qc, kc, vc, bc, gc, h0, scale, use_delta):
        n, c = qc.shape[0], qc.shape[-2]
        b = gc.cumsum(-1)  # [N, B, H, C] local cumulative log-decay
        eb = b.exp()
        e_tail = (b[..., -1:] - b).exp_()
        decay = eb[..., -1]
        lower_incl = torch.ones(c, c, dtype=torch.bool, device=qc.device).tril()
        gamma = (b[..., :, None] - b[..., None, :]).masked_fill_(~lower_incl, float("-inf")).exp_()
        k_t = kc.transpose(-1, -2)
        attn = torch.matmul(qc, k_t).mul_(gamma)
        if scale != 1.0:
            attn.mul_(scale)
        if use_delta:
            a = torch.matmul(kc, k_t).mul_(gamma).mul_(bc[..., None])
            t_inv = _unit_lower_inverse(a).view(a.shape)  # (I + A)^{-1}: only A's strict lower triangle is read
            w = torch.matmul(t_inv, kc * (bc * eb)[..., None])
            v_new = torch.matmul(t_inv, vc * bc[..., None])  # U, turned into V_new by the state hand-off
        else:
            a = t_inv = w = None
            v_new = vc * bc[..., None]
        hs = h0.new_empty(n + 1, *h0.shape)  # hs[i]: the state entering chunk i; hs[n]: the final state
        hs[0] = h0
        _state_forward(hs, v_new, w, kc, e_tail, decay)
        o = torch.matmul(qc, hs[:n]).mul_((eb * scale)[..., None])
        o.flatten(0, -3).baddbmm_(attn.flatten(0, -3), v_new.flatten(0, -3))
        ctx.use_delta, ctx.scale = use_delta, scale
        ctx.save_for_backward(qc, kc, vc, bc, eb, e_tail, gamma, a, t_inv, w, attn, hs, v_new)
        return o, hs[n].clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o_in, d_h):
        qc, kc, vc, bc, eb, e_tail, gamma, a, t_inv, w, attn, hs, v_new = ctx.saved_tensors
        n, scale = qc.shape[0], ctx.scale
        hs = hs[:n]
        decay = eb[..., -1]
        d_h = torch.zeros_like(hs[0]) if d_h is None else d_h
        d_o = torch.zeros_like(v_new) if d_o_in is None else d_o_in.contiguous()
        owned = d_o_in is None or d_o.data_ptr() != d_o_in.data_ptr()  # a copy of ours: scaled in place below
        # One scratch buffer for every elementwise product that is only summed ([C, K], [C, V] or [C, C] per chunk).
        scratch = kc.new_empty(qc.shape[:-1].numel() * max(c for c in (*kc.shape[-2:], vc.shape[-1])))
        # Output: O = diag(scale e^b) (Q S) + attn V_new.
        du = torch.matmul(attn.transpose(-1, -2), d_o)  # intra-chunk part of dV_new; the state part is added below
        d_attn = torch.matmul(d_o, v_new.transpose(-1, -2))
        ebs = (eb * scale)[..., None]
        d_o = d_o.mul_(ebs) if owned else d_o * ebs  # dO'
        dhs = torch.matmul(qc.transpose(-1, -2), d_o)  # Q^T dO', overwritten with dh_{i+1} by the state backward
        d_h0 = _state_backward(dhs, d_h, du, w, kc, e_tail, decay)
        d_q = torch.matmul(d_o, hs.transpose(-1, -2))
        del d_o
        db = torch.zeros_like(eb)
        _rowdot_into(db, d_q, qc, scratch)  # through diag(e^b) on the queries
        d_k = torch.matmul(v_new, dhs.transpose(-1, -2)).mul_(e_tail[..., None])  # through k_dec
        s = torch.zeros_like(eb)
        _rowdot_into(s, d_k, kc, scratch)
        db -= s
        d_decay = torch.bmm(dhs.flatten(0, -3).flatten(1).unsqueeze(1), hs.flatten(0, -3).flatten(1).unsqueeze(2))
        d_bc = s.sum(-1) + d_decay.view(decay.shape) * decay  # gradient of b_C from e^{b_C - b} and e^{b_C}
        del dhs, s
        # Intra-chunk attention: attn = scale (Q K^T) * Gamma.
        _rowcol_into(db, d_attn, attn, scratch)
        d_s = d_attn.mul_(gamma)
        if scale != 1.0:
            d_s.mul_(scale)
        d_q.flatten(0, -3).baddbmm_(d_s.flatten(0, -3), kc.flatten(0, -3))
        d_k.flatten(0, -3).baddbmm_(d_s.transpose(-1, -2).flatten(0, -3), qc.flatten(0, -3))
        if ctx.use_delta:
            d_r_v = torch.matmul(t_inv.transpose(-1, -2), du)
            del du
            d_r_k = torch.matmul(d_r_v, hs.transpose(-1, -2)).neg_()
            d_a = torch.matmul(d_r_v, v_new.transpose(-1, -2), out=d_s).tril_(-1).neg_()  # reuses dattn's buffer
            _rowcol_into(db, d_a, a, scratch)
            d_p = d_a.mul_(gamma)
            d_kb = torch.matmul(d_p, kc).addcmul_(d_r_k, eb[..., None])
            kb = torch.mul(kc, bc[..., None], out=scratch[: kc.numel()].view(kc.shape))
            d_k.flatten(0, -3).baddbmm_(d_p.transpose(-1, -2).flatten(0, -3), kb.flatten(0, -3))
            _rowdot_into(db, d_r_k.mul_(eb[..., None]), kb, scratch)  # R_K = diag(e^b) Kb (kb is read first)
            d_beta = torch.zeros_like(eb)
            _rowdot_into(d_beta, d_kb, kc, scratch)
            _rowdot_into(d_beta, d_r_v, vc, scratch)
            d_v = d_r_v.mul_(bc[..., None])
            d_k.addcmul_(d_kb, bc[..., None])
        else:
            d_beta = torch.zeros_like(eb)
            _rowdot_into(d_beta, du, vc, scratch)
            d_v = du.mul_(bc[..., None])
        db[..., -1] += d_bc
        d_g = db.flip(-1).cumsum(-1).flip(-1)
        return d_q, d_k, d_v, d_beta, d_g, d_h0, None, None


def check_chunk_size(chunk_size: int) -> None:
    """Raise ``ValueError`` unless ``chunk_size`` is a positive power of two."""
    if not isinstance(chunk_size, int) or chunk_size < 1 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size={chunk_size!r} must be a positive power of two")


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    use_delta: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked gated delta rule (same contract as :func:`naive_recurrent_gated_delta_rule`).

    Args:
        q: Queries ``[B, T, H, K]``.
        k: Keys ``[B, T, H, K]``.
        v: Values ``[B, T, H, V]``.
        beta: Write strengths ``[B, T, H]``.
        g: Log-gates ``[B, T, H]`` (``<= 0``) or ``None`` (DeltaNet, no decay).
        scale: Query scale, default ``K ** -0.5``.
        initial_state: ``[B, H, K, V]`` or ``None``.
        output_final_state: Also return the final state ``[B, H, K, V]``.
        chunk_size: ``C``, a power of two.
        use_delta: ``False`` gives Mamba2-style gated linear attention (``A = 0``, ``W = 0``).

    Returns:
        ``(o [B, T, H, V], h_T or None)``; computed in float32 (float64 stays float64), returned in ``v``'s dtype.
    """
    _check_inputs(q, k, v, beta, g, initial_state)
    check_chunk_size(chunk_size)
    bsz, t, nh, dk = q.shape
    dv = v.shape[-1]
    scale = dk**-0.5 if scale is None else scale
    out_dtype = v.dtype
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    c = chunk_size
    n = max(1, -(-t // c))
    pad = n * c - t
    if g is None:
        g = beta.new_zeros(beta.shape)

    def prep(x: torch.Tensor) -> torch.Tensor:  # [B, T, H, ...] -> [N, B, H, C, ...], chunk-major and contiguous
        x = x.to(dt)
        if pad:
            x = F.pad(x, (0, 0, 0, 0, 0, pad)) if x.dim() == 4 else F.pad(x, (0, 0, 0, pad))
        x = x.reshape(bsz, n, c, nh, *x.shape[3:])
        return (x.permute(1, 0, 3, 2, 4) if x.dim() == 5 else x.permute(1, 0, 3, 2)).contiguous()

    qc, kc, vc = prep(q), prep(k), prep(v)
    bc, gc = prep(beta), prep(g)
    state = q.new_zeros(bsz, nh, dk, dv, dtype=dt) if initial_state is None else initial_state.to(dt)
    o, state = _ChunkGatedDeltaRule.apply(qc, kc, vc, bc, gc, state, float(scale), use_delta)
    o = o.permute(1, 0, 3, 2, 4).reshape(bsz, n * c, nh, dv)[:, :t]
    return o.to(out_dtype), (state if output_final_state else None)
