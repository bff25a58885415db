"""Flow warping and modulated deformable convolution (DCNv2, Zhu et al. 2019) for TMRNet's alignment.

:func:`naive_modulated_deform_conv2d` is the readable twin of ``torchvision.ops.deform_conv2d`` (the fast path the
network uses): every kernel tap samples the input bilinearly at its own offset position, the sample is scaled by the
tap's modulation mask, and the weights contract the taps. Offsets follow torchvision's layout, ``[B, 2 G k_h k_w, H,
W]`` holding ``(dy, dx)`` per (offset group, tap); the mask is ``[B, G k_h k_w, H, W]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def _sample(x: Tensor, px: Tensor, py: Tensor) -> Tensor:
    """Bilinear samples of ``x`` ``[B, C, H, W]`` at absolute pixel positions ``px``, ``py`` ``[B, H', W']`` (zero
    outside the image) -> ``[B, C, H', W']``."""
    h, w = x.shape[-2:]
    grid = torch.stack([2 * px / max(w - 1, 1) - 1, 2 * py / max(h - 1, 1) - 1], dim=-1)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=True)


def flow_warp(x: Tensor, flow: Tensor) -> Tensor:
    """Backward warp: ``out(p) = x(p + flow(p))`` with ``flow`` ``[B, 2, H, W]`` as ``(dx, dy)`` pixels."""
    b, _, h, w = x.shape
    ys, xs = torch.meshgrid(
        torch.arange(h, dtype=x.dtype, device=x.device), torch.arange(w, dtype=x.dtype, device=x.device), indexing="ij"
    )
    return _sample(x, xs[None] + flow[:, 0], ys[None] + flow[:, 1])


def naive_modulated_deform_conv2d(
    x: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    mask: Tensor | None = None,
    padding: int = 1,
) -> Tensor:
    """``y(p) = b + sum_k w_k m_k(p) x(p + p_k + dp_k(p))`` (DCNv2 Eq. (3)), stride 1, dilation 1.

    Args:
        x: ``[B, C_in, H, W]``.
        offset: ``[B, 2 G K, H_out, W_out]`` with ``K = k_h k_w``; ``(dy, dx)`` per group ``g`` and tap ``k`` at
            channels ``2 (g K + k)`` and ``2 (g K + k) + 1``.
        weight: ``[C_out, C_in, k_h, k_w]``.
        bias: ``[C_out]`` or ``None``.
        mask: ``[B, G K, H_out, W_out]`` modulation scalars, or ``None`` (all ones).
        padding: zero padding of the input (same on both sides).

    Returns:
        ``[B, C_out, H_out, W_out]``.
    """
    b, cin, h, w = x.shape
    cout, _, kh, kw = weight.shape
    k = kh * kw
    groups = offset.shape[1] // (2 * k)
    hout, wout = offset.shape[-2:]
    ys, xs = torch.meshgrid(
        torch.arange(hout, dtype=x.dtype, device=x.device),
        torch.arange(wout, dtype=x.dtype, device=x.device),
        indexing="ij",
    )
    cpg = cin // groups
    cols = x.new_zeros(b, cin, k, hout, wout)
    for g in range(groups):
        xg = x[:, g * cpg : (g + 1) * cpg]
        for i in range(kh):
            for j in range(kw):
                t = i * kw + j
                dy, dx = offset[:, 2 * (g * k + t)], offset[:, 2 * (g * k + t) + 1]
                sample = _sample(xg, xs[None] - padding + j + dx, ys[None] - padding + i + dy)
                if mask is not None:
                    sample = sample * mask[:, g * k + t, None]
                cols[:, g * cpg : (g + 1) * cpg, t] = sample
    out = torch.einsum("oik,bikhw->bohw", weight.reshape(cout, cin, k), cols)
    return out if bias is None else out + bias[None, :, None, None]


def batched_modulated_deform_conv2d(
    x: Tensor,
    offset: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    mask: Tensor | None = None,
    padding: int = 1,
) -> Tensor:
    """Same as :func:`naive_modulated_deform_conv2d` with one ``grid_sample`` over all groups and taps (a CPU fast
    path: ``torchvision``'s CPU backward is a scalar loop). Arguments and result as there."""
    b, cin, h, w = x.shape
    cout, _, kh, kw = weight.shape
    k = kh * kw
    groups = offset.shape[1] // (2 * k)
    hout, wout = offset.shape[-2:]
    ky, kx = torch.meshgrid(
        torch.arange(kh, dtype=x.dtype, device=x.device),
        torch.arange(kw, dtype=x.dtype, device=x.device),
        indexing="ij",
    )
    ys = torch.arange(hout, dtype=x.dtype, device=x.device)[:, None] - padding
    xs = torch.arange(wout, dtype=x.dtype, device=x.device)[None, :] - padding
    off = offset.view(b, groups, k, 2, hout, wout)
    py = ys + ky.reshape(k, 1, 1) + off[:, :, :, 0]  # [B, G, K, H', W']
    px = xs + kx.reshape(k, 1, 1) + off[:, :, :, 1]
    grid = torch.stack([2 * px / max(w - 1, 1) - 1, 2 * py / max(h - 1, 1) - 1], dim=-1)
    grid = grid.reshape(b * groups, k * hout, wout, 2)
    xg = x.reshape(b * groups, cin // groups, h, w)
    cols = F.grid_sample(xg, grid, mode="bilinear", padding_mode="zeros", align_corners=True)
    cols = cols.view(b, groups, cin // groups, k, hout, wout)
    if mask is not None:
        cols = cols * mask.view(b, groups, 1, k, hout, wout)
    out = torch.einsum("oik,bikhw->bohw", weight.reshape(cout, cin, k), cols.reshape(b, cin, k, hout, wout))
    return out if bias is None else out + bias[None, :, None, None]
