"""Chunked parallel gated delta rule: the WY / UT-transform algorithm of Gated DeltaNet (Yang et al., ICLR 2025, §3.3).

Inside a chunk of ``C`` tokens, with ``b_r = sum_{s<=r} g_s`` the local cumulative log-decay and
``Gamma_rs = exp(b_r - b_s)`` for ``r >= s`` (0 otherwise), the chunk's rows ``Q`` (scaled), ``K``, ``V``,
``beta`` and incoming state ``S`` (``[K, V]``, the transpose of the paper's ``S``) give (Eqs. (8)-(9) with the gated
WY representation of §3.3; fla ``naive_chunk_gated_delta_rule``)::

    A     = strictly_lower(diag(beta) (K K^T) * Gamma)          # C x C
    T     = (I + A)^{-1}                                         # UT transform (blocked inversion)
    W     = T diag(beta) diag(e^b) K                             # "k_cumdecay"
    U     = T diag(beta) V                                       # pseudo-values
    V_new = U - W S
    O     = diag(e^b) Q S + ((Q K^T) * Gamma * lower_incl) V_new
    S'    = e^{b_C} S + (diag(e^{b_C - b}) K)^T V_new

``Gamma`` is always formed from differences ``b_r - b_s`` with ``r >= s`` (the upper triangle is zeroed before
``exp`` and after), never from ``e^{b}`` and ``e^{-b}`` separately, which overflows for long chunks with strong decay.
The UT transform is applied as the stored inverse ``T = (I + A)^{-1}`` (a blocked inversion and two matmuls, not a
triangular solve). The state-independent intra-chunk work runs in groups of matrices sized for the L2 cache; the
``T / C`` state hand-offs run in a Python loop that also forms each chunk's output (and, in the backward, the gradient
parts that read the states). The whole algorithm is one autograd node with a hand-written backward
(:class:`_ChunkGatedDeltaRule`).
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


# Matrices per group of the intra-chunk work: every product of a group runs on operands that stay in the L2 cache
# (32 matrices of 64 x 64 float32 = 512 KiB), so a chain of products and elementwise steps reads its inputs from memory
# once; one batched call over all chunks instead streams every intermediate through memory (a chain of
# four products: about 1.25x slower on this CPU).
_GROUP = 32


def _unit_lower_inverse(a: torch.Tensor, out: torch.Tensor, base: int = 16) -> torch.Tensor:
    """``out = (I + strict_lower(a))^{-1}`` for contiguous ``[M, C, C]`` batches (``C`` a power of two), by blocks.

    The diagonal ``base x base`` blocks are inverted by one batched triangular solve; then, doubling the block size,
    ``[[T11, 0], [A21, T22]]^{-1}`` has the off-diagonal block ``-T22 A21 T11``: two small batched matmuls per level.
    Only the strict lower triangle of ``a`` is read. On CPU this is about twice as fast as one ``C x C``
    triangular solve per matrix against the identity (LAPACK's ``trsm`` on small matrices, at ``C = 64``), and with
    ``T`` stored ``W``, ``U`` and the backward's transposed solve become matmuls.
    """
    m, c = a.shape[0], a.shape[-1]
    s = min(base, c)
    eye = torch.eye(s, dtype=a.dtype, device=a.device)

    def blocks(x: torch.Tensor, size: int, step: int, offset: int) -> torch.Tensor:
        # the [M, C / step, size, size] blocks of x at (offset + j * step * (C + 1)): diagonal blocks or just below
        return x.as_strided((m, c // step, size, size), (c * c, step * (c + 1), c, 1), x.storage_offset() + offset)

    out.zero_()
    diag = blocks(a, s, s, 0).reshape(-1, s, s)
    inv = torch.linalg.solve_triangular(diag, eye.expand(diag.shape), upper=False, unitriangular=True)
    blocks(out, s, s, 0).copy_(inv.view(m, c // s, s, s))
    while s < c:
        t11, t22 = blocks(out, s, 2 * s, 0), blocks(out, s, 2 * s, s * (c + 1))
        blocks(out, s, 2 * s, s * c).copy_(torch.matmul(torch.matmul(t22, blocks(a, s, 2 * s, s * c)), t11).neg_())
        s *= 2
    return out


def _rowdot(x: torch.Tensor, y: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """``(x * y).sum(-1)``, the product written into ``scratch`` (reused: no fresh allocation)."""
    return torch.mul(x, y, out=scratch[: x.numel()].view(x.shape)).sum(-1)


def _rowcol(x: torch.Tensor, y: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """``G.sum(-1) - G.sum(-2)`` with ``G = x * y`` (``[..., C, C]``) written into ``scratch``."""
    g = torch.mul(x, y, out=scratch[: x.numel()].view(x.shape))
    return g.sum(-1).sub_(g.sum(-2))


def _groups(m: int):
    return [slice(i, min(i + _GROUP, m)) for i in range(0, m, _GROUP)]


class _ChunkGatedDeltaRule(torch.autograd.Function):
    """The whole chunked algorithm as one autograd node with a hand-written backward (module docstring for the
    forward). Inputs are chunk-major ``[N, B, H, C, ...]`` (``q`` unscaled; ``scale`` is applied inside) plus
    ``h0 [B, H, K, V]``.

    Forward: the state-independent intra-chunk work (``Gamma``, ``attn = scale (Q K^T) * Gamma``, ``A``, the UT
    transform as the stored inverse ``T = (I + A)^{-1}`` (:func:`_unit_lower_inverse`), ``W = T diag(beta e^b) K``,
    ``U = T diag(beta) V``) runs in groups of ``_GROUP`` matrices over all chunks; then one loop over the chunks
    hands the state on and forms the outputs (``V_new = U - W S``, ``O = diag(scale e^b) (Q S) + attn V_new``,
    ``S' = e^{b_C} S + (diag(e^{b_C - b}) K)^T V_new``), four small matmuls per chunk on operands in cache.

    Backward: a reverse loop over the chunks gives ``dU = dV_new`` and the state gradients ``dS_{i+1}``; then the
    chunk-local gradients run in groups again, with ``G = dGamma * Gamma`` collected from both masked products
    (``dattn * attn`` and ``dA * A``, so ``Q K^T`` and ``Kb K^T`` need not be kept) and ``dO' = diag(scale e^b) dO``::

        dR_V = T^T dU                   dR_K = T^T dW = -dR_V S^T         (dW = -dU S^T)
        dA = -strict_lower(dR_K W^T + dR_V U^T) = -strict_lower(dR_V V_new^T)
        dQ = scale (dattn * Gamma) K + dO' S^T
        dK = scale (dattn * Gamma)^T Q + (dA * Gamma)^T Kb + diag(beta) dKb + diag(e^{b_C - b}) V_new dS_{i+1}^T
        dKb = (dA * Gamma) K + diag(e^b) dR_K          dV = diag(beta) dR_V
        db_r += sum_s G_rs - sum_s G_sr  (+ the e^b, e^{b_C - b}, e^{b_C} terms);  dg = reverse cumsum of db

    The two identities on the second and third line (``V_new = U - W S`` per chunk) replace four ``C``-sized
    products of the plain chain rule by two, and mean ``U`` need not be kept. Compared with autograd through the
    composed ops this avoids the ``[C, C]`` temporaries of the masked products and almost every fresh full-size
    buffer (on CPU a fresh multi-MB buffer costs page faults once the allocator has returned the memory between
    calls): intermediates live in small per-group buffers, products accumulate in place (``baddbmm_``,
    ``addcmul_``). ``tests/ops/test_gated_delta_rule.py`` checks it against the token-by-token recurrence in float64.
    """

    @staticmethod
    def forward(ctx, qc, kc, vc, bc, gc, h0, scale, use_delta):
        n, bsz, nh, c, dk = qc.shape
        dv, bh = vc.shape[-1], bsz * nh
        m = n * bh
        b = gc.cumsum(-1)  # [N, B, H, C] local cumulative log-decay
        eb = b.exp()
        e_tail = (b[..., -1:] - b).exp_()
        q3, k3, v3 = qc.view(m, c, dk), kc.view(m, c, dk), vc.view(m, c, dv)
        b2, beta2, rk2 = b.view(m, c, 1), bc.view(m, c, 1), (bc * eb).view(m, c, 1)
        gamma, attn = qc.new_empty(m, c, c), qc.new_empty(m, c, c)
        a = t_inv = w = None
        if use_delta:
            a, t_inv, w = qc.new_empty(m, c, c), qc.new_empty(m, c, c), qc.new_empty(m, c, dk)
        v_new = qc.new_empty(m, c, dv)  # U, turned into V_new by the state hand-off
        g = min(_GROUP, m)
        r_k, r_v = qc.new_empty(g, c, dk), qc.new_empty(g, c, dv)
        for sl in _groups(m):
            # exp of the lower triangle only matters; the upper one is zeroed before (no overflow) and after exp
            # (exp of a finite 0 is several times faster on CPU than exp of -inf from a masked fill).
            gam = torch.sub(b2[sl], b2[sl].transpose(-1, -2), out=gamma[sl]).tril_().exp_().tril_()
            k_t = k3[sl].transpose(-1, -2)
            torch.bmm(q3[sl], k_t, out=attn[sl]).mul_(gam)
            if scale != 1.0:
                attn[sl].mul_(scale)
            if use_delta:
                a_g = torch.bmm(k3[sl], k_t, out=a[sl]).mul_(gam).mul_(beta2[sl])
                t_g = _unit_lower_inverse(a_g, t_inv[sl])  # (I + A)^{-1}: only A's strict lower triangle is read
                j = sl.stop - sl.start
                torch.bmm(t_g, torch.mul(k3[sl], rk2[sl], out=r_k[:j]), out=w[sl])
                torch.bmm(t_g, torch.mul(v3[sl], beta2[sl], out=r_v[:j]), out=v_new[sl])
            else:
                torch.mul(v3[sl], beta2[sl], out=v_new[sl])
        # The state hand-off, chunk by chunk: hs[i] is the state entering chunk i, hs[n] the final state.
        hs = h0.new_empty(n + 1, bh, dk, dv)
        hs[0] = h0.reshape(bh, dk, dv)
        o = qc.new_empty(n, bh, c, dv)
        k_dec = qc.new_empty(bh, c, dk)
        k_dec_t = k_dec.transpose(-1, -2)
        ebs = (eb * scale).view(n, bh, c, 1).unbind(0)
        decay = eb[..., -1].reshape(n, bh, 1, 1).unbind(0)
        e_t = e_tail.view(n, bh, c, 1).unbind(0)
        split = [x.view(n, bh, *x.shape[1:]).unbind(0) if x is not None else [None] * n for x in (q3, k3, w, attn)]
        v_n, o_n, hs_n = v_new.view(n, bh, c, dv).unbind(0), o.unbind(0), hs.unbind(0)
        for i, (q_i, k_i, w_i, attn_i) in enumerate(zip(*split)):  # views made once, not per step
            h, v_i = hs_n[i], v_n[i]
            if w_i is not None:
                v_i.baddbmm_(w_i, h, alpha=-1.0)
            torch.bmm(q_i, h, out=o_n[i]).mul_(ebs[i]).baddbmm_(attn_i, v_i)
            torch.mul(k_i, e_t[i], out=k_dec)
            torch.mul(h, decay[i], out=hs_n[i + 1]).baddbmm_(k_dec_t, v_i)
        ctx.use_delta, ctx.scale = use_delta, scale
        ctx.save_for_backward(qc, kc, vc, bc, eb, e_tail, gamma, a, t_inv, w, attn, hs, v_new)
        return o.view(n, bsz, nh, c, dv), hs[n].view(h0.shape).clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, d_h):
        qc, kc, vc, bc, eb, e_tail, gamma, a, t_inv, w, attn, hs, v_new = ctx.saved_tensors
        n, bsz, nh, c, dk = qc.shape
        dv, bh, scale, use_delta = vc.shape[-1], bsz * nh, ctx.scale, ctx.use_delta
        m = n * bh
        # Both incoming gradients are tensors (autograd materialises an unused output's gradient as zeros).
        d_o = d_o.reshape(m, c, dv).contiguous()  # a copy when d_o is strided or expanded (e.g. from o.sum())
        ebs = (eb * scale).view(m, c, 1)
        decay = eb[..., -1]
        # Reverse loop over the chunks with dS_{i+1} (``dh``): dU = dV_new = attn^T dO + k_dec dS_{i+1} (kept in d_v's
        # buffer until the groups below), and the parts of dQ, dK and d(e^{b_C}) that read the states.
        q3, k3, v3 = qc.view(m, c, dk), kc.view(m, c, dk), vc.view(m, c, dv)
        d_q, d_k, d_v = torch.empty_like(qc), torch.empty_like(kc), torch.empty_like(vc)
        d_q3, d_k3, du = d_q.view(m, c, dk), d_k.view(m, c, dk), d_v.view(m, c, dv)
        d_dec = eb.new_empty(n, bh)
        dh, nxt = d_h.reshape(bh, dk, dv).clone(), hs.new_empty(bh, dk, dv)
        dh_t, nxt_t = dh.transpose(-1, -2), nxt.transpose(-1, -2)
        k_dec, do_s, s_kv = qc.new_empty(bh, c, dk), qc.new_empty(bh, c, dv), hs.new_empty(bh, dk, dv)

        # Per-chunk views (and transposes) made once, not per step: each view is a dispatched op too.
        def by_chunk(x, transpose=False):
            if x is None:
                return [None] * n
            x = x.view(n, bh, *x.shape[-2:])
            return (x.transpose(-1, -2) if transpose else x).unbind(0)

        split = [by_chunk(k3), by_chunk(q3, True), by_chunk(w, True), by_chunk(hs[:n], True), by_chunk(attn, True)]
        split.append(by_chunk(hs[:n]))
        per_chunk = [x.view(n, bh, *x.shape[1:]).unbind(0) for x in (v_new, du, d_o, d_q3, d_k3)]
        ebs_n, e_t = ebs.view(n, bh, c, 1).unbind(0), e_tail.view(n, bh, c, 1).unbind(0)
        dec = decay.reshape(n, bh, 1, 1).unbind(0)
        for i in reversed(range(n)):
            k_i, q_t, w_t, h_t, attn_t, h_i = (x[i] for x in split)
            vn_i, du_i, do_i, dq_i, dk_i = (x[i] for x in per_chunk)
            torch.bmm(attn_t, do_i, out=du_i).baddbmm_(torch.mul(k_i, e_t[i], out=k_dec), dh)
            torch.mul(do_i, ebs_n[i], out=do_s)  # dO'
            torch.bmm(do_s, h_t, out=dq_i)
            torch.bmm(vn_i, dh_t, out=dk_i).mul_(e_t[i])  # through k_dec (before diag(e^{b_C - b}))
            torch.sum(torch.mul(dh, h_i, out=s_kv), (-1, -2), out=d_dec[i])
            torch.bmm(q_t, do_s, out=nxt)
            if w_t is not None:
                nxt.baddbmm_(w_t, du_i, alpha=-1.0)
            nxt.addcmul_(dh, dec[i])
            dh, nxt, dh_t, nxt_t = nxt, dh, nxt_t, dh_t
        d_h0 = dh
        # Chunk-local gradients, in groups.
        hs3 = hs[:n].view(m, dk, dv)
        beta3, eb3 = bc.view(m, c, 1), eb.view(m, c, 1)
        db, d_beta = eb.new_empty(m, c), eb.new_empty(m, c)
        d_bc = d_dec.view(m) * decay.view(m)  # gradient of b_C from e^{b_C}; the e^{b_C - b} part is added below
        g = min(_GROUP, m)
        d_p, r_v = qc.new_empty(g, c, c), qc.new_empty(g, c, dv)
        x_k, kb = qc.new_empty(g, c, dk), qc.new_empty(g, c, dk)
        scratch = qc.new_empty(g * c * max(c, dk, dv))
        for sl in _groups(m):
            j = sl.stop - sl.start
            dp, xk, kbg = d_p[:j], x_k[:j], kb[:j]
            q_g, k_g, v_g, vn_g, s_g = q3[sl], k3[sl], v3[sl], v_new[sl], hs3[sl]
            dq, dk_g, du_g = d_q3[sl], d_k3[sl], du[sl]
            db_g = _rowdot(dq, q_g, scratch)  # through diag(e^b) on the queries
            s_tail = _rowdot(dk_g, k_g, scratch)
            db_g -= s_tail
            d_bc[sl] += s_tail.sum(-1)
            torch.bmm(d_o[sl], vn_g.transpose(-1, -2), out=dp)  # d attn
            db_g += _rowcol(dp, attn[sl], scratch)
            dp.mul_(gamma[sl])  # d(Q K^T) / scale: the scale rides on the products' alpha
            dq.baddbmm_(dp, k_g, alpha=scale)
            dk_g.baddbmm_(dp.transpose(-1, -2), q_g, alpha=scale)
            if use_delta:
                d_r_v = torch.bmm(t_inv[sl].transpose(-1, -2), du_g, out=r_v[:j])
                # xk = -dR_K, dp = -dA (signs folded into the uses below)
                torch.bmm(d_r_v, s_g.transpose(-1, -2), out=xk)
                torch.bmm(d_r_v, vn_g.transpose(-1, -2), out=dp).tril_(-1)
                db_g -= _rowcol(dp, a[sl], scratch)
                dp.mul_(gamma[sl])
                torch.mul(k_g, beta3[sl], out=kbg)
                db_g -= _rowdot(xk.mul_(eb3[sl]), kbg, scratch)  # R_K = diag(e^b) Kb
                xk.baddbmm_(dp, k_g)  # = -dKb
                dk_g.baddbmm_(dp.transpose(-1, -2), kbg, alpha=-1.0)
                d_beta[sl] = _rowdot(d_r_v, v_g, scratch) - _rowdot(xk, k_g, scratch)
                dk_g.addcmul_(xk, beta3[sl], value=-1.0)
                torch.mul(d_r_v, beta3[sl], out=du_g)  # dV, over dU
            else:
                d_beta[sl] = _rowdot(du_g, v_g, scratch)
                du_g.mul_(beta3[sl])
            db[sl] = db_g
        db.view(m, c)[:, -1] += d_bc
        d_g = db.view(eb.shape).flip(-1).cumsum(-1).flip(-1)
        return d_q, d_k, d_v, d_beta.view(eb.shape), d_g, d_h0.view(bsz, nh, dk, dv), None, None


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
