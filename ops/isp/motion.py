"""Procedural motion per sub-frame: the suite's replacement for the paper's RIFE video-frame interpolation.

The paper renders ``1 + 4 + 16 + 64 + 256 = 341`` sub-frames by interpolating 12 consecutive HDR video frames ``2^5``
times. Here a static photo (made HDR) is viewed through a moving camera (a sub-pixel crop whose offset follows a
linear drift plus a shake), and a bright object (a light source) moves on its own trajectory over it. This gives
the two effects the bracket model has to handle: a misalignment that grows with the exposure index and motion blur
inside the long exposures, plus local motion that no global flow explains.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def translate_crops(scene: Tensor, offsets: Tensor, size: tuple[int, int]) -> Tensor:
    """Bilinear crops of ``scene`` ``[3, Hs, Ws]`` at sub-pixel top-left ``offsets`` ``[K, 2]`` (``x, y``, scene
    pixels): ``out[k, :, i, j] = scene(:, i + y_k, j + x_k)``; returns ``[K, 3, h, w]``."""
    h, w = size
    hs, ws = scene.shape[-2:]
    ys = torch.arange(h, dtype=scene.dtype, device=scene.device)[None, :, None] + offsets[:, 1, None, None]
    xs = torch.arange(w, dtype=scene.dtype, device=scene.device)[None, None, :] + offsets[:, 0, None, None]
    ys, xs = torch.broadcast_tensors(ys, xs)
    grid = torch.stack([2 * xs / (ws - 1) - 1, 2 * ys / (hs - 1) - 1], dim=-1)
    src = scene[None].expand(offsets.shape[0], -1, -1, -1)
    return F.grid_sample(src, grid, mode="bilinear", padding_mode="border", align_corners=True)


def paste_light(frames: Tensor, centers: Tensor, radius: float, radiance: Tensor) -> Tensor:
    """Composite a soft disk of ``radiance`` ``[3]`` and ``radius`` (pixels) at ``centers`` ``[K, 2]`` (``x, y``)
    onto ``frames`` ``[K, 3, h, w]``: ``out = (1 - a) f + a radiance`` with ``a = sigmoid((radius - d) / 0.7)``."""
    h, w = frames.shape[-2:]
    ys = torch.arange(h, dtype=frames.dtype, device=frames.device)[None, :, None]
    xs = torch.arange(w, dtype=frames.dtype, device=frames.device)[None, None, :]
    d = ((xs - centers[:, 0, None, None]) ** 2 + (ys - centers[:, 1, None, None]) ** 2).sqrt()
    a = torch.sigmoid((radius - d) / 0.7)[:, None]
    return (1 - a) * frames + a * radiance.to(frames)[None, :, None, None]


def camera_path(k: int, shift: float, shake: float, u: Tensor) -> Tensor:
    """``[k, 2]`` camera offsets (``x, y``, pixels) relative to sub-frame 0: a drift of length ``shift`` over the
    ``k`` sub-frames in direction ``2 pi u[0]`` plus a sinusoidal shake of amplitude ``shake`` (phases ``u[1:3]``).

    Args:
        k: number of sub-frames.
        shift: total drift (pixels) from the first to the last sub-frame.
        shake: shake amplitude (pixels); one period over the bracket.
        u: ``[3]`` uniform draws in ``[0, 1]``.
    """
    s = torch.linspace(0.0, 1.0, k, dtype=u.dtype)
    angle = 2 * math.pi * u[0]
    drift = torch.stack([s * shift * torch.cos(angle), s * shift * torch.sin(angle)], dim=-1)
    phase = 2 * math.pi * u[1:3]
    wobble = shake * torch.stack([torch.sin(2 * math.pi * s + phase[0]), torch.sin(2 * math.pi * s + phase[1])], -1)
    return drift + wobble - wobble[:1]


def oracle_flow(path: Tensor, counts: list[int]) -> Tensor:
    """``[n_exp, 2]`` global flow (``dx, dy``) from the reference sub-frame to each exposure: the reference pixel
    ``x`` shows the scene point that exposure ``n`` shows, on average over its window, at ``x + flow_n``, i.e.
    ``flow_n = path[0] - mean_{k in window n} path[k]``."""
    out, start = [], 0
    for m in counts:
        out.append(path[0] - path[start : start + m].mean(0))
        start += m
    return torch.stack(out)
