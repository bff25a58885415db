"""Readable loop twins of PreWorld's vectorised functions (parity oracles, float64 in the tests)."""

from __future__ import annotations

import math

import torch


def naive_contract(p: torch.Tensor, bg_len: float) -> torch.Tensor:
    out = []
    for q in p.reshape(-1, 3):
        n = torch.sqrt((q * q).sum())
        out.append(q if n <= 1 else q / n * ((1 + bg_len) - bg_len / n))
    return torch.stack(out).reshape(p.shape)


def naive_raw2alpha(sigma: torch.Tensor, shift: float, interval: float) -> torch.Tensor:
    return 1.0 - torch.pow(1.0 + torch.exp(sigma + shift), -interval)


def naive_alphas_to_weights(alpha: torch.Tensor, threshold: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    ws, ts = [], []
    for a in alpha:
        trans, row = a.new_ones(()), []
        for ai in a:
            wi = ai * trans
            row.append(wi if (threshold <= 0 or (ai >= threshold and wi >= threshold)) else wi * 0)
            trans = trans * (1 - ai)
        ws.append(torch.stack(row))
        ts.append(trans)
    return torch.stack(ws), torch.stack(ts)


def naive_trilinear(volume: torch.Tensor, points: torch.Tensor, pc_range: tuple[float, ...]) -> torch.Tensor:
    """Trilinear interpolation at voxel centres with zero padding. volume [B, C, X, Y, Z], points [B, N, 3]."""
    b, c, *grid = volume.shape
    out = volume.new_zeros(b, points.shape[1], c)
    for bi in range(b):
        for n in range(points.shape[1]):
            acc = volume.new_zeros(c)
            u = [(points[bi, n, k] - pc_range[k]) / (pc_range[3 + k] - pc_range[k]) * grid[k] - 0.5 for k in range(3)]
            base = [math.floor(float(x.detach())) for x in u]
            for dx in (0, 1):
                for dy in (0, 1):
                    for dz in (0, 1):
                        ijk = (base[0] + dx, base[1] + dy, base[2] + dz)
                        if not all(0 <= ijk[k] < grid[k] for k in range(3)):
                            continue
                        wt = 1.0
                        for k, d in enumerate((dx, dy, dz)):
                            f = u[k] - base[k]
                            wt = wt * (f if d else 1 - f)
                        acc = acc + wt * volume[bi, :, ijk[0], ijk[1], ijk[2]]
            out[bi, n] = acc
    return out


def naive_render(w: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    out = values.new_zeros(w.shape[0], values.shape[-1])
    for r in range(w.shape[0]):
        for s in range(w.shape[1]):
            out[r] = out[r] + w[r, s] * values[r, s]
    return out


def naive_sample_depths(t, points, origins, radius: float, mode: str) -> torch.Tensor:
    """Per-sample depth by its definition, one sample at a time (twin of ``render.sample_depths``)."""
    out = points.new_zeros(points.shape[:2])
    for r in range(points.shape[0]):
        for i in range(points.shape[1]):
            if mode == "contracted":
                diff = points[r, i] - origins[r]
                out[r, i] = torch.sqrt((diff * diff).sum())
            else:
                out[r, i] = radius * (1 - 1 / (1 + t[i]))
    return out


def naive_distortion(w: torch.Tensor, s: torch.Tensor, interval: torch.Tensor | float) -> torch.Tensor:
    """O(S^2) double sum of Mip-NeRF360's Eq. (15)."""
    s = s.expand_as(w)
    interval = torch.as_tensor(interval, dtype=w.dtype).expand_as(w)
    total = w.new_zeros(())
    for r in range(w.shape[0]):
        for i in range(w.shape[1]):
            for j in range(w.shape[1]):
                total = total + w[r, i] * w[r, j] * (s[r, i] - s[r, j]).abs()
            total = total + w[r, i] ** 2 * interval[r, i] / 3
    return total / w.shape[0]


def naive_sem_scal(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    p = torch.softmax(logits, -1)
    terms = []
    for c in range(logits.shape[1]):
        y = (target == c).to(p.dtype)
        if y.sum() == 0:
            continue
        pc = p[:, c]
        loss = 0.0
        if pc.sum() > 0:
            loss = loss - torch.log(((pc * y).sum() / pc.sum()).clamp(1e-7, 1))
        loss = loss - torch.log(((pc * y).sum() / y.sum()).clamp(1e-7, 1))
        if (1 - y).sum() > 0:
            loss = loss - torch.log((((1 - pc) * (1 - y)).sum() / (1 - y).sum()).clamp(1e-7, 1))
        terms.append(loss)
    return torch.stack(terms).mean()


def naive_sigmoid_focal(logits, target, class_weight, voxel_weight, gamma=2.0, alpha=0.25, scale=100.0):
    """Sigmoid focal loss voxel by voxel and class by class (twin of ``losses.sigmoid_focal``): per class channel
    a binary focal term against the one-hot label, weighted by the channel's class weight and the voxel weight,
    summed over channels, averaged over non-ignored voxels, times ``scale``."""
    total, n = logits.new_zeros(()), 0
    for i in range(logits.shape[0]):
        if int(target[i]) == 255:
            continue
        n += 1
        for c in range(logits.shape[1]):
            y = 1.0 if int(target[i]) == c else 0.0
            p = 1 / (1 + torch.exp(-logits[i, c]))
            p_t = p if y else 1 - p
            a_t = alpha if y else 1 - alpha
            total = total - class_weight[c] * voxel_weight[i] * a_t * (1 - p_t) ** gamma * torch.log(p_t)
    return scale * total / n


def naive_lovasz_class(err: torch.Tensor, fg: torch.Tensor) -> torch.Tensor:
    """Lovasz extension of the Jaccard loss of one class by its definition: sort errors, and weight each by the
    increase of 1 - IoU when its pixel joins the predicted set."""
    order = sorted(range(err.numel()), key=lambda i: -float(err[i]))
    total, prev = err.new_zeros(()), 0.0
    gts = float(fg.sum())
    for k in range(1, len(order) + 1):
        sel = order[:k]
        inter = gts - sum(float(fg[i]) for i in sel)
        union = gts + sum(1 - float(fg[i]) for i in sel)
        jac = 1.0 - inter / union
        total = total + err[order[k - 1]] * (jac - prev)
        prev = jac
    return total


def naive_voxel_pool(depth, context, points, pc_range, grid) -> torch.Tensor:
    b, n, d, h, w = depth.shape
    c = context.shape[2]
    out = depth.new_zeros(b, c, *grid)
    size = [(pc_range[3 + k] - pc_range[k]) / grid[k] for k in range(3)]
    for bi in range(b):
        for ni in range(n):
            for di in range(d):
                for hi in range(h):
                    for wi in range(w):
                        p = points[bi, ni, di, hi, wi]
                        ijk = [math.floor((float(p[k]) - pc_range[k]) / size[k]) for k in range(3)]
                        if all(0 <= ijk[k] < grid[k] for k in range(3)):
                            f = depth[bi, ni, di, hi, wi] * context[bi, ni, :, hi, wi]
                            out[bi, :, ijk[0], ijk[1], ijk[2]] = out[bi, :, ijk[0], ijk[1], ijk[2]] + f
    return out
