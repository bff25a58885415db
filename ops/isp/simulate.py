"""Exposure-bracket simulation of BracketIRE (paper Sec. 4.1 and its data-generation code), as pure functions.

Pipeline of one bracket (``n = 0..N-1`` exposures, ratio ``r = 4``; exposure ``n`` lasts ``r^n`` sub-frames):

1. every linear-RGB sub-frame ``L_k`` is scaled by the exposure ``r^(n - c)`` (``c = 2``, the middle exposure,
   saturates at radiance 1) and clipped to ``[0, 1]`` (sensor saturation);
2. unprocessed to RAW (Brooks et al. 2019): colour correction ``rgb2cam``, the safe inversion of the white-balance
   gains, clipping, RGGB mosaic (:func:`unprocess_linear`);
3. the ``r^n`` RAW sub-frames of exposure ``n`` are averaged (this creates the motion blur of long exposures),
   clipped, corrupted by heteroscedastic Gaussian noise ``N(0, x sigma_s + sigma_r)`` (:func:`add_noise`, levels of
   :func:`iso1600near_levels`), clipped and quantised to 10 bits (:func:`quantize`).

The ground truth is the clean RAW of sub-frame 0 (the reference, the shortest exposure) in the middle exposure's
units, so HDR values may exceed 1 (:func:`hdr_ground_truth`). Tensors are channel-first: RGB ``[..., 3, H, W]``,
packed RAW ``[..., 4, H/2, W/2]`` with channels ``(R, G_r, G_b, B)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

# XYZ -> camera matrix of the Xiaomi 10S used by the official generator, and sRGB (D65) -> XYZ.
XYZ2CAM = ((0.734375, -0.125, -0.0859375), (-0.2734375, 1.109375, 0.140625), (-0.015625, 0.21875, 0.40625))
RGB2XYZ = ((0.4124564, 0.3575761, 0.1804375), (0.2126729, 0.7151522, 0.0721750), (0.0193339, 0.1191920, 0.9503041))
RED_GAIN = (1 / 0.91, 1 / 0.40)  # U[lo, hi] of the red / blue white-balance gains (Xiaomi 10S)
BLUE_GAIN = (1 / 0.75, 1 / 0.39)
SHOT_RANGE = (0.0012, 0.0048)  # log-uniform shot-noise range "near ISO 1600"
READ_LINE = (1.869, 0.3276, 0.30)  # log sigma_r = a log sigma_s + b + N(0, s^2)
SAFE_INFLECTION = 0.9


def srgb_linearize(x: Tensor) -> Tensor:
    """sRGB -> linear (IEC 61966-2-1): ``x / 12.92`` below 0.04045, ``((x + 0.055) / 1.055)^2.4`` above."""
    hi = ((x.clamp(min=0.04045) + 0.055) / 1.055) ** 2.4  # the clamp keeps the unused branch finite (gradients)
    return torch.where(x > 0.04045, hi, x / 12.92)


def srgb_delinearize(x: Tensor) -> Tensor:
    """Linear -> sRGB: ``12.92 x`` below 0.0031308, ``1.055 x^(1/2.4) - 0.055`` above (inverse of
    :func:`srgb_linearize`)."""
    hi = 1.055 * x.clamp(min=0.0031308) ** (1 / 2.4) - 0.055
    return torch.where(x > 0.0031308, hi, 12.92 * x)


def rgb2cam_matrix(dtype: torch.dtype = torch.float32) -> Tensor:
    """``[3, 3]`` sRGB -> camera matrix ``XYZ2CAM @ RGB2XYZ`` with rows normalised to sum 1 (Brooks et al.)."""
    m = torch.tensor(XYZ2CAM, dtype=torch.float64) @ torch.tensor(RGB2XYZ, dtype=torch.float64)
    return (m / m.sum(-1, keepdim=True)).to(dtype)


def apply_ccm(img: Tensor, ccm: Tensor) -> Tensor:
    """``out_c = sum_d ccm[c, d] img_d`` on ``[..., 3, H, W]``; ``ccm`` is ``[3, 3]`` or batched ``[..., 3, 3]``."""
    return torch.einsum("...cd,...dhw->...chw", ccm, img)


def _gains(red_gain: Tensor | float, blue_gain: Tensor | float, like: Tensor) -> Tensor:
    """``[..., 3, 1, 1]`` per-channel gains ``(r, 1, b)`` broadcastable against ``like`` (``[..., 3, H, W]``)."""
    r = torch.as_tensor(red_gain, dtype=like.dtype, device=like.device)
    b = torch.as_tensor(blue_gain, dtype=like.dtype, device=like.device)
    return torch.stack([r, torch.ones_like(r), b], dim=-1)[..., None, None]


def safe_invert_gains(img: Tensor, red_gain: Tensor | float, blue_gain: Tensor | float) -> Tensor:
    """Invert the white-balance gains, keeping near-white pixels from dimming (Brooks et al. 2019, Sec. 3.2).

    ``mask = (max(gray - 0.9, 0) / 0.1)^2`` with ``gray`` the channel mean; ``g_safe = max(mask + (1 - mask) / g,
    1 / g)``; returns ``img * g_safe``. ``img`` is ``[..., 3, H, W]``; the gains are scalars or ``[...]``.
    """
    inv = 1.0 / _gains(red_gain, blue_gain, img)
    gray = img.mean(dim=-3, keepdim=True)
    mask = ((gray - SAFE_INFLECTION).clamp(min=0.0) / (1.0 - SAFE_INFLECTION)) ** 2
    return img * torch.maximum(mask + (1.0 - mask) * inv, inv)


def apply_gains(raw: Tensor, red_gain: Tensor | float, blue_gain: Tensor | float) -> Tensor:
    """White balance of a packed RAW ``[..., 4, h, w]``: ``R * r``, ``B * b`` (the greens unchanged)."""
    g = _gains(red_gain, blue_gain, raw)
    return raw * torch.cat([g[..., :2, :, :], g[..., 1:2, :, :], g[..., 2:, :, :]], dim=-3)


def pack_rggb(bayer: Tensor) -> Tensor:
    """Bayer mosaic ``[..., H, W]`` (RGGB) -> packed ``[..., 4, H/2, W/2]`` with channels ``(R, G_r, G_b, B)``."""
    h, w = bayer.shape[-2:]
    if h % 2 or w % 2:
        raise ValueError(f"an RGGB mosaic needs even height and width, got {h}x{w}")
    return torch.stack(
        [bayer[..., 0::2, 0::2], bayer[..., 0::2, 1::2], bayer[..., 1::2, 0::2], bayer[..., 1::2, 1::2]], dim=-3
    )


def unpack_rggb(packed: Tensor) -> Tensor:
    """Inverse of :func:`pack_rggb`: ``[..., 4, h, w]`` -> ``[..., 2h, 2w]``."""
    if packed.shape[-3] != 4:
        raise ValueError(f"packed RGGB needs 4 channels, got shape {tuple(packed.shape)}")
    h, w = packed.shape[-2:]
    out = packed.new_zeros(*packed.shape[:-3], 2 * h, 2 * w)
    out[..., 0::2, 0::2], out[..., 0::2, 1::2] = packed[..., 0, :, :], packed[..., 1, :, :]
    out[..., 1::2, 0::2], out[..., 1::2, 1::2] = packed[..., 2, :, :], packed[..., 3, :, :]
    return out


def mosaic_rggb(rgb: Tensor) -> Tensor:
    """RGGB mosaic of an RGB image ``[..., 3, H, W]``, packed: ``[..., 4, H/2, W/2]`` (R, G at R rows, G at B rows,
    B)."""
    h, w = rgb.shape[-2:]
    if h % 2 or w % 2:
        raise ValueError(f"an RGGB mosaic needs even height and width, got {h}x{w}")
    return torch.stack(
        [rgb[..., 0, 0::2, 0::2], rgb[..., 1, 0::2, 1::2], rgb[..., 1, 1::2, 0::2], rgb[..., 2, 1::2, 1::2]], dim=-3
    )


def unprocess_linear(
    lin: Tensor, rgb2cam: Tensor, red_gain: Tensor | float, blue_gain: Tensor | float, clip: bool = True
) -> Tensor:
    """Linear sRGB ``[..., 3, H, W]`` -> packed camera RAW ``[..., 4, H/2, W/2]`` (Brooks et al.; the inverse tone
    curve is disabled, as in the official generator): inverse CCM, safe gain inversion, clip to ``[0, 1]``, mosaic.
    """
    cam = safe_invert_gains(apply_ccm(lin, rgb2cam), red_gain, blue_gain)
    return mosaic_rggb(cam.clamp(0.0, 1.0) if clip else cam)


def hdr_ground_truth(lin: Tensor, rgb2cam: Tensor, red_gain: Tensor | float, blue_gain: Tensor | float) -> Tensor:
    """Clean HDR RAW of the reference sub-frame ``lin`` ``[3, H, W]`` (radiance may exceed 1): normalised by its
    maximum ``m = max(1, max lin)``, unprocessed, multiplied back by ``m`` (the official ``raw_gt * raw_max``)."""
    m = lin.amax().clamp(min=1.0)
    return unprocess_linear(lin / m, rgb2cam, red_gain, blue_gain) * m


def iso1600near_levels(u: Tensor, z: Tensor, shot_range: tuple[float, float] = SHOT_RANGE) -> tuple[Tensor, Tensor]:
    """Shot / read noise variances "near ISO 1600" (Xiaomi 10S, the official generator).

    ``log sigma_s = log lo + u (log hi - log lo)``, ``log sigma_r = 1.869 log sigma_s + 0.3276 + 0.3 z``.

    Args:
        u: uniform draws in ``[0, 1]``, any shape.
        z: standard-normal draws, same shape.
        shot_range: ``(lo, hi)`` of ``sigma_s`` (a shifted domain uses another range).
    """
    lo, hi = math.log(shot_range[0]), math.log(shot_range[1])
    log_shot = lo + u * (hi - lo)
    a, b, s = READ_LINE
    return log_shot.exp(), (a * log_shot + b + s * z).exp()


def add_noise(x: Tensor, shot: Tensor | float, read: Tensor | float, eps: Tensor) -> Tensor:
    """Heteroscedastic Gaussian noise ``x + sqrt(x sigma_s + sigma_r) eps``, ``eps ~ N(0, 1)`` given (``x >= 0``)."""
    return x + (x.clamp(min=0.0) * shot + read).sqrt() * eps


def quantize(x: Tensor, bits: int = 10) -> Tensor:
    """``round(clip(x, 0, 1) (2^bits - 1)) / (2^bits - 1)``: the stored integer code, as a float in ``[0, 1]``."""
    q = 2**bits - 1
    return torch.round(x.clamp(0.0, 1.0) * q) / q


def subframe_counts(n_exp: int = 5, ratio: int = 4) -> list[int]:
    """Sub-frames per exposure, ``[ratio^0, ..., ratio^(n_exp-1)]`` (1, 4, 16, 64, 256: 341 in all)."""
    return [ratio**n for n in range(n_exp)]


def exposure_scales(n_exp: int = 5, ratio: int = 4, ref: int = 2) -> list[float]:
    """Exposure of frame ``n`` relative to the middle one: ``ratio^(n - ref)``."""
    return [float(ratio) ** (n - ref) for n in range(n_exp)]


def exposure_normalize(raws: Tensor, ratio: int = 4, ref: int = 2) -> Tensor:
    """Scale frame ``i`` of ``[..., T, 4, h, w]`` by ``ratio^(ref - i)`` (to the middle exposure's units; the official
    ``set_input``: ``[16, 4, 1, 1/4, 1/16]`` for ``T = 5``)."""
    t = raws.shape[-4]
    s = torch.tensor([float(ratio) ** (ref - i) for i in range(t)], dtype=raws.dtype, device=raws.device)
    return raws * s[:, None, None, None]


def downsample_x4(img: Tensor) -> Tensor:
    """Area (4x4 box) downsampling of ``[..., C, H, W]`` for BracketIRE+ inputs (H, W multiples of 4)."""
    h, w = img.shape[-2:]
    if h % 4 or w % 4:
        raise ValueError(f"x4 downsampling needs height and width divisible by 4, got {h}x{w}")
    return img.reshape(*img.shape[:-2], h // 4, 4, w // 4, 4).mean(dim=(-3, -1))


def _check_bracket(frames: Tensor, n_exp: int, ratio: int) -> int:
    if frames.dim() != 4 or frames.shape[1] != 3:
        raise ValueError(f"sub-frames must be [K, 3, H, W] linear RGB, got shape {tuple(frames.shape)}")
    need = sum(subframe_counts(n_exp, ratio))
    if frames.shape[0] < need:
        raise ValueError(f"{n_exp} exposures of ratio {ratio} need {need} sub-frames, got {frames.shape[0]}")
    return need


def simulate_bracket(
    frames: Tensor,
    rgb2cam: Tensor,
    red_gain: Tensor | float,
    blue_gain: Tensor | float,
    shot: Tensor,
    read: Tensor,
    eps: Tensor,
    n_exp: int = 5,
    ratio: int = 4,
    bits: int = 10,
) -> Tensor:
    """Exposure bracket from linear sub-frames (vectorised; :func:`naive_simulate_bracket` is its loop twin).

    Args:
        frames: ``[K, 3, H, W]`` linear RGB radiance in the middle exposure's units, ``K >= sum_n ratio^n``;
            exposure ``n`` averages sub-frames ``[S_n, S_n + ratio^n)`` with ``S_n = sum_{j<n} ratio^j``.
        rgb2cam, red_gain, blue_gain: the unprocessing parameters (one camera per bracket).
        shot, read: ``[n_exp]`` noise variances of each exposure.
        eps: ``[n_exp, 4, H/2, W/2]`` standard-normal draws.
        n_exp, ratio: number of exposures and their ratio (5 and 4 in the paper).
        bits: quantisation depth (10).

    Returns:
        ``[n_exp, 4, H/2, W/2]`` noisy, clipped, quantised RAW frames in ``[0, 1]``.
    """
    need = _check_bracket(frames, n_exp, ratio)
    counts = subframe_counts(n_exp, ratio)
    which = torch.repeat_interleave(torch.arange(n_exp, device=frames.device), torch.tensor(counts))
    scale = torch.tensor(exposure_scales(n_exp, ratio), dtype=frames.dtype, device=frames.device)[which]
    raw = unprocess_linear((frames[:need] * scale[:, None, None, None]).clamp(0.0, 1.0), rgb2cam, red_gain, blue_gain)
    summed = raw.new_zeros(n_exp, *raw.shape[1:]).index_add_(0, which, raw)
    mean = (summed / torch.tensor(counts, dtype=raw.dtype, device=raw.device)[:, None, None, None]).clamp(0.0, 1.0)
    shot, read = shot.to(raw)[:, None, None, None], read.to(raw)[:, None, None, None]
    return quantize(add_noise(mean, shot, read, eps).clamp(0.0, 1.0), bits)


def naive_simulate_bracket(
    frames: Tensor,
    rgb2cam: Tensor,
    red_gain: Tensor | float,
    blue_gain: Tensor | float,
    shot: Tensor,
    read: Tensor,
    eps: Tensor,
    n_exp: int = 5,
    ratio: int = 4,
    bits: int = 10,
) -> Tensor:
    """Readable twin of :func:`simulate_bracket`: one exposure, one sub-frame at a time (the official loop)."""
    _check_bracket(frames, n_exp, ratio)
    out, start = [], 0
    for n in range(n_exp):
        m = ratio**n
        acc = 0.0
        for k in range(start, start + m):
            ldr = (frames[k] * float(ratio) ** (n - 2)).clamp(0.0, 1.0)
            acc = acc + unprocess_linear(ldr, rgb2cam, red_gain, blue_gain)
        raw = (acc / m).clamp(0.0, 1.0)
        out.append(quantize(add_noise(raw, shot[n], read[n], eps[n]).clamp(0.0, 1.0), bits))
        start += m
    return torch.stack(out)
