"""Chunked parallel gated delta rule: the WY / UT-transform algorithm of Gated DeltaNet (Yang et al., ICLR 2025, §3.3).

Inside a chunk of ``C`` tokens, with ``b_r = sum_{s<=r} g_s`` the local cumulative log-decay and
``Gamma_rs = exp(b_r - b_s)`` for ``r >= s`` (0 otherwise), the chunk's rows ``Q`` (pre-scaled), ``K``, ``V``,
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
The intra-chunk work is batched over all chunks; only the ``T / C`` state hand-offs run in a Python loop.
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

    def prep(x: torch.Tensor) -> torch.Tensor:  # [B, T, H, ...] -> [B, H, N, C, ...]
        x = x.to(dt).transpose(1, 2)
        if pad:
            x = F.pad(x, (0, 0, 0, pad)) if x.dim() == 4 else F.pad(x, (0, pad))
        return x.reshape(bsz, nh, n, c, *x.shape[3:])

    qc, kc, vc = prep(q) * scale, prep(k), prep(v)
    bc, gc = prep(beta), prep(g)

    b = gc.cumsum(-1)  # [B, H, N, C]
    lower_incl = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    diff = (b[..., :, None] - b[..., None, :]).masked_fill(~lower_incl, float("-inf"))
    gamma = diff.exp()  # [B, H, N, C, C], zero above the diagonal
    u = bc[..., None] * vc
    if use_delta:
        a = (bc[..., None] * (kc @ kc.transpose(-1, -2)) * gamma).tril(-1)
        eye = torch.eye(c, dtype=dt, device=q.device)
        tri = eye + a
        w = torch.linalg.solve_triangular(tri, bc[..., None] * b.exp()[..., None] * kc, upper=False, unitriangular=True)
        u = torch.linalg.solve_triangular(tri, u, upper=False, unitriangular=True)
    attn = (qc @ kc.transpose(-1, -2)) * gamma
    q_dec = qc * b.exp()[..., None]
    k_dec = kc * (b[..., -1:] - b).exp()[..., None]
    decay = b[..., -1].exp()[..., None, None]  # [B, H, N, 1, 1]

    state = q.new_zeros(bsz, nh, dk, dv, dtype=dt) if initial_state is None else initial_state.to(dt)
    outs = []
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ state if use_delta else u[:, :, i]
        outs.append(q_dec[:, :, i] @ state + attn[:, :, i] @ v_new)
        state = decay[:, :, i] * state + k_dec[:, :, i].transpose(-1, -2) @ v_new
    o = torch.stack(outs, dim=2).reshape(bsz, nh, n * c, dv)[:, :, :t].transpose(1, 2)
    return o.to(out_dtype), (state if output_final_state else None)
