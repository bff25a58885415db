"""Loop twins of :mod:`ops.nforgot.losses` (readable references for the parity tests)."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def naive_linear_time_mmd(x: Tensor, y: Tensor, kernel_mul: float = 2.0, kernel_num: int = 5) -> Tensor:
    m = min(x.shape[0], y.shape[0]) // 2
    total = x.new_zeros(())
    for i in range(m):
        a, a2, b, b2 = x[2 * i], x[2 * i + 1], y[2 * i], y[2 * i + 1]
        pairs = [(a, a2, 1.0), (b, b2, 1.0), (a, b2, -1.0), (a2, b, -1.0)]
        sqs = [((u - v) ** 2).sum() for u, v, _ in pairs]
        s = (sum(float(q.detach()) for q in sqs) / 4 + 1e-6) / kernel_mul ** (kernel_num // 2)
        for (_, _, sign), q in zip(pairs, sqs):
            for band in range(kernel_num):
                total = total + sign * torch.exp(-q / (s * kernel_mul**band))
    return total / m


def _kernel(u: Tensor, v: Tensor, base: float, kernel_mul: float, kernel_num: int) -> Tensor:
    q = ((u - v) ** 2).sum()
    return sum(torch.exp(-q / (base * kernel_mul**b)) for b in range(kernel_num))


def naive_wl_kernel_mmd(
    x: Tensor,
    y: Tensor,
    lx: list[int] | None = None,
    ly: list[int] | None = None,
    kernel_mul: float = 2.0,
    kernel_num: int = 5,
) -> Tensor:
    """Loop twin of ``wl_kernel_mmd`` (and of ``multi_kernel_mmd`` when the labels are None)."""
    pts = [p.flatten() for p in x] + [p.flatten() for p in y]
    labs = (list(lx) + list(ly)) if lx is not None else [0] * len(pts)
    n, total = x.shape[0], len(pts)
    s = sum(float(((pts[i] - pts[j]) ** 2).sum().detach()) for i in range(total) for j in range(total))
    base = s / (total * total - total) / kernel_mul ** (kernel_num // 2)
    out = x.new_zeros(())
    for i in range(total):
        for j in range(total):
            if labs[i] != labs[j]:
                continue
            same = (i < n) == (j < n)
            w = 1.0 / (n * n if i < n else (total - n) ** 2) if same else -1.0 / (n * (total - n))
            out = out + w * _kernel(pts[i], pts[j], base, kernel_mul, kernel_num)
    return out


def naive_prototype_distance_loss(emb_cur: Tensor, emb_prev: Tensor, labels: Tensor, old_protos: Tensor) -> Tensor:
    classes = sorted(set(labels.tolist()))
    rows = []
    for c in classes:
        sel = [i for i in range(labels.numel()) if int(labels[i]) == c]
        p = sum(emb_cur[i] for i in sel) / len(sel)
        p0 = sum(emb_prev[i] for i in sel) / len(sel)
        rows.append(torch.stack([((p - q) ** 2).sum() - ((p0 - q) ** 2).sum() for q in old_protos]))
    return torch.stack(rows).pow(2).sum().sqrt()


def naive_kd_loss(z: Tensor, z_old: Tensor, T: float = 2.0) -> Tensor:
    total = z.new_zeros(())
    for i in range(z.shape[0]):
        p = [math.exp(float(v) / T) for v in z_old[i]]
        zp = sum(p)
        lse = torch.logsumexp(z[i] / T, 0)
        total = total + sum(-(p[c] / zp) * (z[i, c] / T - lse) for c in range(z.shape[1]))
    return total / z.shape[0]
