"""Token-by-token reference of the gated delta rule (Gated DeltaNet, Yang et al., ICLR 2025).

Paper notation (Eq. (10)): ``S_t = S_{t-1} (alpha_t (I - beta_t k_t k_t^T)) + beta_t v_t k_t^T``, ``o_t = S_t q_t``
with ``S in R^{d_v x d_k}``. As fla and the NVlabs code do, we store the transpose ``h = S^T in R^{d_k x d_v}``
and keep the gate in log space, ``g_t = log alpha_t <= 0``::

    h   <- exp(g_t) * h                    # gate (decay) first
    v'  <- beta_t * (v_t - h^T k_t)        # delta-rule error scaled by beta
    h   <- h + k_t v'^T                    # rank-1 write
    o_t <- h^T (scale * q_t)

The switches give the paper's baselines with the same code:

* ``g=None``: DeltaNet (Eq. (5), ``alpha_t = 1``);
* ``use_delta=False``: Mamba2-style gated linear attention ``h <- alpha_t h + beta_t k_t v_t^T`` (Eq. (3));
* both: plain (beta-weighted) linear attention.

q and k are *not* normalised here (the layer L2-normalises them), matching fla's kernels.
"""

from __future__ import annotations

import torch

from ops.gated_delta_rule.chunk import _check_inputs  # shared validation


def naive_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    g: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_delta: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Recurrent gated delta rule, one token at a time (the parity oracle).

    Args:
        q: Queries ``[B, T, H, K]``.
        k: Keys ``[B, T, H, K]``.
        v: Values ``[B, T, H, V]``.
        beta: Write strengths ``[B, T, H]``.
        g: Log-gates ``log alpha_t`` ``[B, T, H]`` (``<= 0``), or ``None`` for no gate (DeltaNet).
        scale: Query scale, default ``K ** -0.5``.
        initial_state: ``h_0`` ``[B, H, K, V]`` or ``None`` (zeros).
        output_final_state: Also return ``h_T`` ``[B, H, K, V]``.
        use_delta: ``False`` drops the delta (erase) term: gated linear attention.

    Returns:
        ``(o [B, T, H, V], h_T or None)`` in the dtype of ``v``.
    """
    _check_inputs(q, k, v, beta, g, initial_state)
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    scale = dk**-0.5 if scale is None else scale
    state = q.new_zeros(b, h, dk, dv) if initial_state is None else initial_state.to(q.dtype)
    outs = []
    # ``unbind`` once (one stack in backward): indexing ``x[:, i]`` per token would make autograd zero-fill and add a
    # full-size gradient per token, a quadratic-in-T backward that is an artefact, not the cost of the recurrence.
    qs, ks, vs, bs = (q * scale).unbind(1), k.unbind(1), v.unbind(1), beta.unbind(1)
    gs = g.exp().unbind(1) if g is not None else None
    for i in range(t):
        q_i, k_i, v_i, b_i = qs[i], ks[i], vs[i], bs[i]  # [B,H,K], [B,H,K], [B,H,V], [B,H]
        if gs is not None:
            state = state * gs[i][..., None, None]
        if use_delta:
            v_i = v_i - torch.einsum("bhkv,bhk->bhv", state, k_i)
        state = state + torch.einsum("bhk,bhv->bhkv", k_i, v_i * b_i[..., None])
        outs.append(torch.einsum("bhkv,bhk->bhv", state, q_i))
    o = torch.stack(outs, dim=1) if outs else v.new_zeros(b, 0, h, dv)
    return o.to(v.dtype), (state if output_final_state else None)
