"""O(T^2) log-space reference of stick-breaking attention (Tan et al., "Scaling Stick-Breaking Attention", ICLR 2025).

Logits ``z_ij = inv_temp * q_i . k_j`` give break probabilities ``beta_ij = sigmoid(z_ij)``. For a key ``j`` before
query ``i`` (Eq. (1)-(2))::

    A_ij     = beta_ij * prod_{j < k < i} (1 - beta_ik)
    log A_ij = logsigmoid(z_ij) - sum_{j < k < i} softplus(z_ik)        # stable log-space form
    o_i      = sum_j A_ij v_j,       rem_i = 1 - sum_j A_ij = prod_k (1 - beta_ik)

With ``attend_current=True`` the key range includes ``j = i``. There are no positional embeddings. The suffix sum is a
reversed cumulative sum (O(T^2) memory and flops instead of the O(T^3) einsum of the official ``sb_ref``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Shape contract ``q, k: [B, H, T, D]``, ``v: [B, H, T, Dv]``; raises ``ValueError`` naming the mismatch."""
    if q.dim() != 4:
        raise ValueError(f"q must be [B, H, T, D], got shape {tuple(q.shape)}")
    if k.shape != q.shape:
        raise ValueError(f"k shape {tuple(k.shape)} must equal q shape {tuple(q.shape)} (same head dim)")
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be [B, H, T, Dv] with [B, H, T] = {tuple(q.shape[:3])}, got {tuple(v.shape)}")


def naive_stickbreaking(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    inv_temp: float | None = None,
    attend_current: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stick-breaking attention, materialising the ``T x T`` weights.

    Args:
        q: Queries ``[B, H, T, D]``.
        k: Keys ``[B, H, T, D]``.
        v: Values ``[B, H, T, Dv]``.
        inv_temp: Logit scale, default ``D ** -0.5``.
        attend_current: Include ``j = i`` in the stick.

    Returns:
        ``(o [B, H, T, Dv], rem [B, H, T])``; logits in float32 (float64 stays float64), ``o`` in ``v``'s dtype.
    """
    check_qkv(q, k, v)
    t, d = q.shape[-2], q.shape[-1]
    inv_temp = d**-0.5 if inv_temp is None else inv_temp
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    z = (q.to(dt) @ k.to(dt).transpose(-1, -2)) * inv_temp  # [B, H, T, T]
    allowed = torch.ones(t, t, dtype=torch.bool, device=q.device).tril(0 if attend_current else -1)
    sp = F.softplus(z).masked_fill(~allowed, 0.0)
    # suffix sum strictly after j: sum_{k > j, k allowed} softplus(z_ik)
    after = sp.flip(-1).cumsum(-1).flip(-1) - sp
    log_a = (F.logsigmoid(z) - after).masked_fill(~allowed, float("-inf"))
    a = log_a.exp()
    o = a @ v.to(dt)
    rem = torch.exp(-sp.sum(-1))
    return o.to(v.dtype), rem.to(v.dtype)


def product_stickbreaking(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, inv_temp: float | None = None, attend_current: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Direct product form ``A_ij = beta_ij prod (1 - beta_ik)`` (O(T^3), unstable for large logits): a test oracle."""
    check_qkv(q, k, v)
    t, d = q.shape[-2], q.shape[-1]
    inv_temp = d**-0.5 if inv_temp is None else inv_temp
    beta = torch.sigmoid((q @ k.transpose(-1, -2)) * inv_temp)
    allowed = torch.ones(t, t, dtype=torch.bool, device=q.device).tril(0 if attend_current else -1)
    beta = beta * allowed
    a = torch.zeros_like(beta)
    for i in range(t):
        for j in range(t):
            if allowed[i, j]:
                a[..., i, j] = beta[..., i, j] * torch.prod(1 - beta[..., i, j + 1 :], dim=-1)
    return a @ v, 1 - a.sum(-1)
