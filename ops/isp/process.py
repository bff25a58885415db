"""RAW -> linear sRGB for scoring and viewing, and the mu-law tone map of the paper's loss and metrics."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ops.isp.simulate import apply_ccm, apply_gains

MU = 5000.0
HDR_SCALE = 16.0  # outputs and ground truths are divided by 16 before the tone map (the official loss / metric)


def mu_tonemap(x: Tensor, mu: float = MU) -> Tensor:
    """``mu(x) = log(1 + mu x) / log(1 + mu)`` (paper Eq. of the loss; ``mu = 5000``), for ``x >= 0``."""
    return torch.log1p(mu * x) / math.log1p(mu)


def demosaic_half(raw: Tensor) -> Tensor:
    """Half-resolution demosaic of a packed RAW ``[..., 4, h, w]``: ``(R, (G_r + G_b) / 2, B)`` -> ``[..., 3, h, w]``.

    The official metric demosaics with a learned network (``model.bin``); a half-resolution average keeps the score
    free of a second learned model (documented on the methods page)."""
    return torch.stack([raw[..., 0, :, :], 0.5 * (raw[..., 1, :, :] + raw[..., 2, :, :]), raw[..., 3, :, :]], dim=-3)


def raw_to_linear_rgb(raw: Tensor, red_gain: Tensor, blue_gain: Tensor, cam2rgb: Tensor) -> Tensor:
    """Packed RAW ``[B, 4, h, w]`` in ``[0, 1]`` -> linear sRGB ``[B, 3, h, w]`` in ``[0, 1]``: white balance
    (``red_gain``, ``blue_gain``: ``[B]``), half-resolution demosaic, colour correction ``cam2rgb`` ``[B, 3, 3]``."""
    return apply_ccm(demosaic_half(apply_gains(raw, red_gain, blue_gain)), cam2rgb).clamp(0.0, 1.0)


def tonemapped_srgb(raw_hdr: Tensor, meta: dict[str, Tensor], bits: int = 16) -> Tensor:
    """The image the metrics score: ``mu(rgb(clip(raw / 16, 0, 1)))`` quantised to ``bits`` (16 in the official
    evaluation), ``[B, 3, h, w]`` in ``[0, 1]``."""
    rgb = raw_to_linear_rgb((raw_hdr / HDR_SCALE).clamp(0.0, 1.0), meta["red_gain"], meta["blue_gain"], meta["cam2rgb"])
    q = 2**bits - 1
    return torch.round(mu_tonemap(rgb) * q) / q
