"""The 15 image corruptions of CIFAR-10-C / ImageNet-C (Hendrycks & Dietterich, ICLR 2019), at severities 1-5.

Implemented once for every image datamodule (``data.corruption=<name> data.severity=<1..5>`` corrupts the test
split, :class:`CorruptibleImages`) and for SuMi's video stream (:mod:`datamodules.av_corruptions` calls the same
functions with its own table). Images are float ``[N, C, H, W]`` in ``[0, 1]``, ``C`` = 1 (grey) or 3 (RGB); every
function keeps shape and dtype, clamps to ``[0, 1]`` and draws all randomness from one ``torch.Generator``, so a
corruption is a deterministic function of the seed. The default table :data:`CIFAR10_C` holds the paper's CIFAR-10-C
(32x32) parameters; lengths are in pixels except elastic_transform's, which are fractions of the image side.

==========  ==================  =====================================================================================
family      corruption          what it does (CIFAR-10-C parameter per severity 1..5)
==========  ==================  =====================================================================================
noise       gaussian_noise      ``x + N(0, s^2)``; s = .04 .06 .08 .09 .10
noise       shot_noise          ``Poisson(x * lam) / lam``; lam = 500 250 100 75 50
noise       impulse_noise       salt and pepper on a fraction a of the values; a = .01 .02 .03 .05 .07
blur        defocus_blur        disk kernel of radius r, anti-aliased by a 3x3 Gaussian of sigma b; (r, b)
blur        glass_blur          blur sigma, local pixel swaps within d, k passes, blur again; (sigma, d, k)
blur        motion_blur         one-sided Gaussian streak of length 2R+1 (ImageMagick's), random angle; (R, sigma)
blur        zoom_blur           mean of the image zoomed 1.00, 1.01, ... up to z_max; z_max = 1.05 ... 1.25
weather     snow                zoomed thresholded noise, motion-blurred flakes, whitened scene; 7 parameters
weather     frost               ``a x + b F`` with F a frost texture; (a, b)
weather     fog                 ``(x + t P) * max / (max + t)``, P a diamond-square plasma fractal; (t, decay)
weather     brightness          HSV value ``V + v``; v = .05 .10 .15 .20 .30
digital     contrast            ``(x - mean) c + mean`` per channel; c = .75 .5 .4 .3 .15
digital     elastic_transform   random affine (corners moved by +-a) + smoothed random displacement field
digital     pixelate            box-downsample to a fraction f of the side, nearest-upsample; f = .95 ... .65
digital     jpeg_compression    JPEG round trip at quality q (Pillow); q = 80 65 58 50 40
==========  ==================  =====================================================================================

Differences from the reference generator, all documented where they occur: frost uses a procedural texture
(:func:`frost_texture`) as a stand-in for the six frost photographs the original crops from; glass_blur keeps floats
between its two blurs; elastic_transform resamples once (affine and displacement composed) rather
than twice; motion and snow streaks replicate the edge pixels; all arithmetic is float (no 8-bit rounding between
steps, except JPEG's). Grey images: brightness adds to the value itself, snow and frost use the luma.

The real CIFAR-10-C files (``<corruption>.npy``, uint8 ``[5n, 32, 32, 3]``: the n test images at severity 1, then
2, ..., 5; ``labels.npy``) are read by :func:`load_cifar_c` when a datamodule is given ``corruption_dir``.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from core.errors import ConfigError, DataFormatError, MissingDataError

FAMILIES: dict[str, tuple[str, ...]] = {
    "noise": ("gaussian_noise", "shot_noise", "impulse_noise"),
    "blur": ("defocus_blur", "glass_blur", "motion_blur", "zoom_blur"),
    "weather": ("snow", "frost", "fog", "brightness"),
    "digital": ("contrast", "elastic_transform", "pixelate", "jpeg_compression"),
}
CORRUPTIONS: tuple[str, ...] = tuple(name for names in FAMILIES.values() for name in names)
SEVERITIES = (1, 2, 3, 4, 5)

#: Hendrycks & Dietterich's CIFAR-10-C parameters, one entry per severity 1..5.
CIFAR10_C: dict[str, tuple[Any, ...]] = {
    "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),
    "shot_noise": (500.0, 250.0, 100.0, 75.0, 50.0),
    "impulse_noise": (0.01, 0.02, 0.03, 0.05, 0.07),
    "defocus_blur": ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1)),
    "glass_blur": ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)),
    "motion_blur": ((6, 1.0), (6, 1.5), (6, 2.0), (8, 2.0), (9, 2.5)),
    "zoom_blur": (1.05, 1.10, 1.15, 1.20, 1.25),
    # (flake mean, flake std, zoom, threshold, streak radius, streak sigma, scene blend)
    "snow": (
        (0.1, 0.2, 1.0, 0.6, 8, 3.0, 0.95),
        (0.1, 0.2, 1.0, 0.5, 10, 4.0, 0.9),
        (0.15, 0.3, 1.75, 0.55, 10, 4.0, 0.9),
        (0.25, 0.3, 2.25, 0.6, 12, 6.0, 0.85),
        (0.3, 0.3, 1.25, 0.65, 14, 12.0, 0.8),
    ),
    "frost": ((1.0, 0.2), (1.0, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)),
    "fog": ((0.2, 3.0), (0.5, 3.0), (0.75, 2.5), (1.0, 2.0), (1.5, 1.75)),
    "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),
    # (displacement alpha, its smoothing sigma, affine corner jitter), as fractions of the image side (32 px)
    "elastic_transform": (
        (0.0, 0.0, 0.08),
        (0.05, 0.2, 0.07),
        (0.08, 0.06, 0.06),
        (0.1, 0.04, 0.05),
        (0.1, 0.03, 0.03),
    ),
    "pixelate": (0.95, 0.9, 0.85, 0.75, 0.65),
    "jpeg_compression": (80, 65, 58, 50, 40),
}


# -- helpers ---------------------------------------------------------------------------------------------------------
def _pad(x: torch.Tensor, pw: int, ph: int) -> torch.Tensor:
    """Mirror-pad the last two dims (edge-replicate where the image is too small to mirror)."""
    mode = "reflect" if pw < x.shape[-1] and ph < x.shape[-2] else "replicate"
    return F.pad(x, (pw, pw, ph, ph), mode=mode)


def _luma(x: torch.Tensor) -> torch.Tensor:
    """``[N, 1, H, W]`` grey level (BT.601 for RGB, the channel mean otherwise)."""
    if x.shape[1] == 3:
        return 0.299 * x[:, :1] + 0.587 * x[:, 1:2] + 0.114 * x[:, 2:]
    return x.mean(dim=1, keepdim=True)


def _zoom(x: torch.Tensor, z: float) -> torch.Tensor:
    """Zoom into the centre by ``z`` (bilinear, output the input's size)."""
    theta = torch.tensor([[1.0 / z, 0.0, 0.0], [0.0, 1.0 / z, 0.0]], dtype=x.dtype).expand(len(x), 2, 3)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def _streak(x: torch.Tensor, radius: int, sigma: float, angle: torch.Tensor) -> torch.Tensor:
    """ImageMagick-style motion blur: ``sum_i k_i x(p + i u)`` for ``i = 0..2R`` along the unit vector ``u`` of
    ``angle`` (degrees, one per image ``[N]``), ``k_i ~ exp(-i^2 / 2 sigma^2)`` normalised; edges replicate."""
    n, _, h, w = x.shape
    steps = torch.arange(2 * radius + 1, dtype=torch.float64)
    k = torch.exp(-(steps**2) / (2 * sigma**2))
    k = (k / k.sum()).to(x.dtype)
    rad = angle.double() * math.pi / 180
    dy = torch.floor(steps[:, None] * torch.sin(rad)[None] + 0.5).long()  # [2R+1, N]
    dx = torch.floor(steps[:, None] * torch.cos(rad)[None] + 0.5).long()
    rows, cols, nn = torch.arange(h), torch.arange(w), torch.arange(n)[:, None, None]
    out = torch.zeros_like(x)
    for i in range(len(steps)):
        iy = (rows[None] + dy[i][:, None]).clamp(0, h - 1)  # [N, H]
        ix = (cols[None] + dx[i][:, None]).clamp(0, w - 1)  # [N, W]
        out = out + k[i] * x[nn, :, iy[:, :, None], ix[:, None, :]].permute(0, 3, 1, 2)
    return out


def _uniform(shape: tuple[int, ...], low: float, high: float, gen: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(shape, generator=gen, dtype=torch.float64)


def _value_noise(n: int, h: int, w: int, cells: int, gen: torch.Generator) -> torch.Tensor:
    """Smooth random field ``[N, 1, H, W]`` in ``[0, 1]``: a ``cells x cells`` uniform grid, bicubic-upsampled."""
    grid = torch.rand(n, 1, cells, cells, generator=gen)
    return F.interpolate(grid, size=(h, w), mode="bicubic", align_corners=True).clamp(0.0, 1.0)


# -- noise -----------------------------------------------------------------------------------------------------------
def gaussian_noise(x: torch.Tensor, sigma: float, gen: torch.Generator) -> torch.Tensor:
    """Additive white Gaussian noise of standard deviation ``sigma``."""
    return (x + torch.randn(x.shape, generator=gen) * sigma).clamp(0.0, 1.0)


def shot_noise(x: torch.Tensor, lam: float, gen: torch.Generator) -> torch.Tensor:
    """Poisson (photon) noise: ``Poisson(lam x) / lam``; fewer photons ``lam`` = more noise."""
    return (torch.poisson(x * lam, generator=gen) / lam).clamp(0.0, 1.0)


def impulse_noise(x: torch.Tensor, amount: float, gen: torch.Generator) -> torch.Tensor:
    """Salt-and-pepper noise: each value becomes 0 or 1 (equally likely) with probability ``amount``."""
    u = torch.rand(x.shape, generator=gen)
    x = torch.where(u < amount / 2, torch.zeros_like(x), torch.where(u > 1 - amount / 2, torch.ones_like(x), x))
    return x.clamp(0.0, 1.0)


# -- blur ------------------------------------------------------------------------------------------------------------
def gaussian_blur(
    x: torch.Tensor, sigma: float, gen: torch.Generator | None = None, truncate: float = 4.0
) -> torch.Tensor:
    """Separable Gaussian blur of std ``sigma`` px, kernel radius ``ceil(truncate * sigma)``, mirrored edges."""
    return gaussian_blur_raw(x, sigma, truncate).clamp(0.0, 1.0)


def disk_kernel(radius: float, alias_sigma: float) -> torch.Tensor:
    """Defocus kernel ``[K, K]``: the pixels within ``radius`` of the centre, normalised, then smoothed by a Gaussian
    of ``alias_sigma`` (3x3 support up to radius 8, 5x5 beyond, as the reference) to anti-alias the disk's edge."""
    r = int(math.floor(radius))  # the disk's pixels lie within floor(radius) of the centre on each axis
    ax = torch.arange(-r, r + 1, dtype=torch.float64)
    disk = ((ax[:, None] ** 2 + ax[None] ** 2) <= radius**2).double()
    disk = disk / disk.sum()
    half = 1 if radius <= 8 else 2
    g = torch.exp(-(torch.arange(-half, half + 1, dtype=torch.float64) ** 2) / (2 * alias_sigma**2))
    g = g / g.sum()
    # full 2-D convolution (zero padding): the kernel grows by the Gaussian's half-width on each side
    return F.conv2d(disk[None, None], (g[:, None] * g[None])[None, None], padding=2 * half)[0, 0]


def defocus_blur(x: torch.Tensor, params: tuple[float, float], gen: torch.Generator) -> torch.Tensor:
    """Out-of-focus blur: convolution with :func:`disk_kernel` ``(radius, alias_sigma)`` per channel."""
    k = disk_kernel(*params).to(x.dtype)
    p, c = k.shape[-1] // 2, x.shape[1]
    return F.conv2d(_pad(x, p, p), k.expand(c, 1, *k.shape), groups=c).clamp(0.0, 1.0)


def glass_blur(x: torch.Tensor, params: tuple[float, int, int], gen: torch.Generator) -> torch.Tensor:
    """Frosted-glass blur: Gaussian blur, then ``passes`` sweeps (bottom-right to top-left, rows and columns
    ``delta + 1 .. side - delta``) that swap each pixel with the one offset by ``(dy, dx)``, then blur again.
    ``params = (sigma, delta, passes)``. The offsets are drawn from ``[-delta, delta)``, the reference generator's
    range (numpy's exclusive upper bound), so pixels drift up and left as in the released CIFAR-10-C files."""
    sigma, delta, passes = float(params[0]), int(params[1]), int(params[2])
    x = gaussian_blur(x, sigma).clone()
    n, _, h, w = x.shape
    nn = torch.arange(n)
    rows, cols = range(h - delta, delta, -1), range(w - delta, delta, -1)
    jumps = torch.randint(-delta, delta, (passes, len(rows), len(cols), 2, n), generator=gen)
    for p in range(passes):
        for a, i in enumerate(rows):
            for b, j in enumerate(cols):
                i2, j2 = i + jumps[p, a, b, 0], j + jumps[p, a, b, 1]
                here, there = x[nn, :, i, j], x[nn, :, i2, j2]
                x[nn, :, i2, j2] = here
                x[nn, :, i, j] = there
    return gaussian_blur(x, sigma)


def motion_blur(x: torch.Tensor, params: tuple[int, float], gen: torch.Generator) -> torch.Tensor:
    """Camera-shake streak (:func:`_streak`) of ``params = (radius, sigma)`` at a random angle in ``[-45, 45]``."""
    angle = _uniform((len(x),), -45.0, 45.0, gen)
    return _streak(x, int(params[0]), float(params[1]), angle).clamp(0.0, 1.0)


def zoom_blur(x: torch.Tensor, max_zoom: float, gen: torch.Generator) -> torch.Tensor:
    """Radial blur: the mean of the image and its centre zooms ``1.00, 1.01, ..., max_zoom``."""
    zooms = [1.0 + 0.01 * i for i in range(int(round((max_zoom - 1.0) / 0.01)) + 1)]
    out = x.clone()
    for z in zooms:
        out = out + _zoom(x, z)
    return (out / (len(zooms) + 1)).clamp(0.0, 1.0)


# -- weather ---------------------------------------------------------------------------------------------------------
def snow(x: torch.Tensor, params: tuple[float, ...], gen: torch.Generator) -> torch.Tensor:
    """Falling snow: Gaussian noise ``N(mean, std)`` zoomed in, kept above a threshold, streaked by a motion blur at
    an angle in ``[-135, -45]``; the scene is whitened (blend with ``max(x, 1.5 luma + 0.5)``) and the flake layer is
    added twice (as is and rotated 180 degrees)."""
    mean, std, zoom, thresh, radius, sigma, keep = params
    n, _, h, w = x.shape
    flakes = mean + std * torch.randn((n, 1, h, w), generator=gen, dtype=x.dtype)
    flakes = _zoom(flakes, float(zoom))
    flakes = torch.where(flakes < thresh, torch.zeros_like(flakes), flakes).clamp(0.0, 1.0)
    flakes = _streak(flakes, int(radius), float(sigma), _uniform((n,), -135.0, -45.0, gen))
    x = keep * x + (1 - keep) * torch.maximum(x, _luma(x) * 1.5 + 0.5)
    return (x + flakes + flakes.flip(-1, -2)).clamp(0.0, 1.0)


def frost_texture(n: int, c: int, h: int, w: int, gen: torch.Generator) -> torch.Tensor:
    """Procedural frost ``[N, C, H, W]`` in ``[0, 1]``: a stand-in for the frost photographs of the reference.

    ImageNet-C crops its frost layer from six photographs of ice on glass, which the suite does not ship; this
    texture imitates their statistics: a bright, slowly varying haze (value noise of 3 and 6 cells) carrying sharp
    ice-crystal veins (ridged noise ``(1 - |2 v - 1|)^6`` of 5 and 9 cells), mean about 0.45, tinted blue-white on RGB.
    """
    haze = 0.6 * _value_noise(n, h, w, 3, gen) + 0.4 * _value_noise(n, h, w, 6, gen)
    veins = sum(wt * (1 - (2 * _value_noise(n, h, w, k, gen) - 1).abs()) ** 6 for wt, k in ((0.6, 5), (0.4, 9)))
    frost = (0.55 * haze + 0.7 * veins).clamp(0.0, 1.0)
    if c == 3:
        frost = frost * torch.tensor([0.86, 0.93, 1.0]).view(1, 3, 1, 1)
    return frost.expand(n, c, h, w)


def frost(x: torch.Tensor, params: tuple[float, float], gen: torch.Generator) -> torch.Tensor:
    """Frost on the lens: ``a x + b F`` with ``F`` = :func:`frost_texture` (procedural stand-in). ``(a, b)``."""
    a, b = params
    tex = frost_texture(len(x), x.shape[1], x.shape[2], x.shape[3], gen).to(x.dtype)
    return (a * x + b * tex).clamp(0.0, 1.0)


def plasma_fractal(n: int, size: int, decay: float, gen: torch.Generator) -> torch.Tensor:
    """Diamond-square plasma ``[N, size, size]`` in ``[0, 1]`` (``size`` a power of 2, toroidal).

    Each level sets square centres then diamond points to the mean of their four neighbours plus a uniform
    perturbation of amplitude ``wibble^2`` (the reference's), with ``wibble`` starting at 100 and divided by
    ``decay`` per level: a larger ``decay`` gives a smoother fog.
    """
    m = torch.zeros(n, size, size, dtype=torch.float64)
    step, wibble = size, 100.0
    while step >= 2:
        half = step // 2
        corners = m[:, 0::step, 0::step]
        acc = corners + corners.roll(-1, 1)
        acc = acc + acc.roll(-1, 2)
        m[:, half::step, half::step] = acc / 4 + wibble * _uniform(acc.shape, -wibble, wibble, gen)
        corners, centres = m[:, 0::step, 0::step], m[:, half::step, half::step]
        # diamonds between horizontally adjacent corners: left/right corners, centres above/below
        a = corners + corners.roll(-1, 2) + centres + centres.roll(1, 1)
        m[:, 0::step, half::step] = a / 4 + wibble * _uniform(a.shape, -wibble, wibble, gen)
        # diamonds between vertically adjacent corners: corners above/below, centres left/right
        b = corners + corners.roll(-1, 1) + centres + centres.roll(1, 2)
        m[:, half::step, 0::step] = b / 4 + wibble * _uniform(b.shape, -wibble, wibble, gen)
        step, wibble = half, wibble / decay
    m = m - m.amin(dim=(1, 2), keepdim=True)
    return m / m.amax(dim=(1, 2), keepdim=True).clamp_min(1e-12)


def fog(x: torch.Tensor, params: tuple[float, float], gen: torch.Generator) -> torch.Tensor:
    """Fog: add ``t`` times a plasma fractal (:func:`plasma_fractal` of ``decay``), rescale by ``max / (max + t)``
    (``max`` the image's brightest value) so the scene is washed out rather than saturated. ``(t, decay)``."""
    t, decay = params
    n, _, h, w = x.shape
    size = 1 << max(1, math.ceil(math.log2(max(h, w))))
    plasma = plasma_fractal(n, size, float(decay), gen)[:, None, :h, :w].to(x.dtype)
    top = x.amax(dim=(1, 2, 3), keepdim=True)
    return ((x + t * plasma) * top / (top + t)).clamp(0.0, 1.0)


def brightness(x: torch.Tensor, v: float, gen: torch.Generator | None = None) -> torch.Tensor:
    """Brighten by ``v`` in HSV value, hue and saturation kept: RGB pixels scale by ``min(V + v, 1) / V``
    (``V`` = max channel); grey images (and any non-RGB) add ``v`` to each value."""
    if x.shape[1] != 3:
        return (x + v).clamp(0.0, 1.0)
    value = x.amax(dim=1, keepdim=True)
    new = (value + v).clamp(max=1.0)
    return torch.where(value > 0, x * new / value.clamp_min(1e-12), new.expand_as(x)).clamp(0.0, 1.0)


# -- digital ---------------------------------------------------------------------------------------------------------
def contrast(x: torch.Tensor, c: float, gen: torch.Generator | None = None) -> torch.Tensor:
    """Contrast reduction towards each channel's mean: ``(x - mean) c + mean``."""
    mean = x.mean(dim=(2, 3), keepdim=True)
    return ((x - mean) * c + mean).clamp(0.0, 1.0)


def elastic_transform(x: torch.Tensor, params: tuple[float, float, float], gen: torch.Generator) -> torch.Tensor:
    """Elastic warp: a random affine map (three points around the centre moved by ``U(-a, a)``) composed with a
    displacement field ``alpha * G_sigma * U(-1, 1)`` (per axis), bilinear, mirrored edges. ``params = (alpha,
    sigma, a)`` as fractions of the image side."""
    n, _, h, w = x.shape
    side = min(h, w)
    alpha, sigma, jitter = (float(p) * side for p in params)
    cy, cx, sq = h // 2, w // 2, side // 3
    src = torch.tensor([[cx + sq, cy + sq], [cx + sq, cy - sq], [cx - sq, cy - sq]], dtype=torch.float64)
    dst = src + _uniform((n, 3, 2), -jitter, jitter, gen)
    ones = torch.ones(n, 3, 1, dtype=torch.float64)
    # inverse affine (output -> input pixel), solved from the three point pairs: [dst 1] @ A = src
    inv = torch.linalg.solve(torch.cat([dst, ones], 2), src.expand(n, 3, 2))  # [N, 3, 2]
    field = _uniform((n, 2, h, w), -1.0, 1.0, gen).to(x.dtype)
    disp = alpha * gaussian_blur_raw(field, sigma, truncate=3.0) if alpha > 0 else torch.zeros_like(field)
    yy, xx = torch.meshgrid(torch.arange(h, dtype=torch.float64), torch.arange(w, dtype=torch.float64), indexing="ij")
    qx, qy = xx + disp[:, 0].double(), yy + disp[:, 1].double()  # [N, H, W]
    q = torch.stack([qx, qy, torch.ones_like(qx)], -1)  # [N, H, W, 3]
    p = torch.einsum("nhwk,nkc->nhwc", q, inv)  # input (x, y) pixel coordinates
    grid = torch.stack([2 * p[..., 0] / max(w - 1, 1) - 1, 2 * p[..., 1] / max(h - 1, 1) - 1], -1).to(x.dtype)
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=True)
    return out.clamp(0.0, 1.0)


def gaussian_blur_raw(x: torch.Tensor, sigma: float, truncate: float = 4.0) -> torch.Tensor:
    """:func:`gaussian_blur` without the clamp to ``[0, 1]`` (for signed fields)."""
    r = int(np.ceil(truncate * sigma))
    if sigma <= 0 or r == 0:
        return x
    k = torch.exp(-(torch.arange(-r, r + 1, dtype=x.dtype) ** 2) / (2 * sigma**2))
    k = k / k.sum()
    c = x.shape[1]
    x = F.conv2d(_pad(x, r, 0), k.view(1, 1, 1, -1).repeat(c, 1, 1, 1), groups=c)
    return F.conv2d(_pad(x, 0, r), k.view(1, 1, -1, 1).repeat(c, 1, 1, 1), groups=c)


def _box_resize_matrix(n_in: int, n_out: int, dtype: torch.dtype) -> torch.Tensor:
    """``[n_out, n_in]`` weights of Pillow's BOX resampling along one axis: output pixel ``i`` averages the input
    pixels whose centres lie in ``[c - s / 2, c + s / 2)``, ``c = (i + 1/2) n_in / n_out``, ``s = max(n_in / n_out,
    1)`` (area averaging when shrinking, nearest neighbour when enlarging)."""
    scale = n_in / n_out
    centre = (torch.arange(n_out, dtype=torch.float64) + 0.5) * scale
    offset = torch.arange(n_in, dtype=torch.float64)[None] + 0.5 - centre[:, None]
    half = max(scale, 1.0) / 2
    w = ((offset >= -half) & (offset < half)).double()
    return (w / w.sum(1, keepdim=True).clamp_min(1.0)).to(dtype)


def pixelate(x: torch.Tensor, fraction: float, gen: torch.Generator | None = None) -> torch.Tensor:
    """Box-resample down to ``int(fraction * side)`` pixels and back up (Pillow's BOX rule, both ways)."""
    h, w = x.shape[-2:]
    h2, w2 = max(1, int(h * fraction)), max(1, int(w * fraction))
    down_h, down_w = _box_resize_matrix(h, h2, x.dtype), _box_resize_matrix(w, w2, x.dtype)
    up_h, up_w = _box_resize_matrix(h2, h, x.dtype), _box_resize_matrix(w2, w, x.dtype)
    small = torch.einsum("ih,nchw,jw->ncij", down_h, x, down_w)
    return torch.einsum("ih,nchw,jw->ncij", up_h, small, up_w).clamp(0.0, 1.0)


def jpeg_compression(x: torch.Tensor, quality: int, gen: torch.Generator | None = None) -> torch.Tensor:
    """JPEG round trip at ``quality`` (Pillow's encoder, 8-bit; RGB with its default chroma subsampling, grey as
    one luma plane, other channel counts channel by channel)."""
    from PIL import Image

    arr = (x.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu().numpy()
    out = np.empty_like(arr)
    planes = [(slice(None), "RGB")] if arr.shape[1] == 3 else [(slice(k, k + 1), "L") for k in range(arr.shape[1])]
    for i in range(len(arr)):
        for sl, mode in planes:
            img = arr[i, sl].transpose(1, 2, 0)
            buf = io.BytesIO()
            Image.fromarray(img[..., 0] if mode == "L" else img, mode=mode).save(
                buf, format="JPEG", quality=int(quality)
            )
            dec = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert(mode))
            out[i, sl] = dec[None] if mode == "L" else dec.transpose(2, 0, 1)
    return torch.from_numpy(out).to(x.dtype).div(255.0)


FUNCTIONS: dict[str, Callable[[torch.Tensor, Any, torch.Generator], torch.Tensor]] = {
    "gaussian_noise": gaussian_noise,
    "shot_noise": shot_noise,
    "impulse_noise": impulse_noise,
    "defocus_blur": defocus_blur,
    "glass_blur": glass_blur,
    "motion_blur": motion_blur,
    "zoom_blur": zoom_blur,
    "snow": snow,
    "frost": frost,
    "fog": fog,
    "brightness": brightness,
    "contrast": contrast,
    "elastic_transform": elastic_transform,
    "pixelate": pixelate,
    "jpeg_compression": jpeg_compression,
}


def check_corruption(corruption: str | None, severity: int, key: str = "data") -> None:
    """Raise a one-line :class:`ConfigError` for an unknown ``corruption`` or a ``severity`` outside 1..5."""
    if corruption is not None and corruption not in CORRUPTIONS:
        raise ConfigError(f"{key}.corruption={corruption!r} must be null or one of {list(CORRUPTIONS)}")
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or int(severity) not in SEVERITIES:
        raise ConfigError(f"{key}.severity={severity!r} must be one of {list(SEVERITIES)}")


def corrupt(
    images: torch.Tensor, corruption: str, severity: int, seed: int | torch.Generator = 0, chunk: int = 1024
) -> torch.Tensor:
    """Apply ``corruption`` at ``severity`` (CIFAR-10-C parameters) to ``images``.

    Args:
        images: float ``[N, C, H, W]`` in ``[0, 1]``.
        corruption: one of :data:`CORRUPTIONS`.
        severity: 1..5.
        seed: an int or a ``torch.Generator``; the result is a deterministic function of it.
        chunk: images per call (bounds the memory of the vectorised kernels; part of the random stream's layout).

    Returns:
        ``[N, C, H, W]``, same dtype, in ``[0, 1]``.
    """
    check_corruption(corruption, severity)
    if images.dim() != 4 or not images.is_floating_point():
        raise ConfigError(f"corrupt() needs float images [N, C, H, W], got {images.dtype} {list(images.shape)}")
    gen = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(int(seed))
    fn, param = FUNCTIONS[corruption], CIFAR10_C[corruption][int(severity) - 1]
    parts = [fn(images[i : i + chunk], param, gen) for i in range(0, len(images), chunk)]
    return torch.cat(parts) if parts else images.clone()


# -- real CIFAR-10-C files and the datamodule mixin ------------------------------------------------------------------
CIFAR_C_HOW_TO_GET = (
    "CIFAR-10-C: https://zenodo.org/record/2535967 (CIFAR-10-C.tar: one <corruption>.npy per corruption and labels.npy)"
)


def load_cifar_c(
    root: str | Path, corruption: str, severity: int, image_shape: tuple[int, int, int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Severity ``s`` of one corruption from a CIFAR-10-C-style folder.

    ``<root>/<corruption>.npy`` is uint8 ``[5 n, H, W, C]`` (``[5 n, H, W]`` for grey): the ``n`` test images at
    severity 1, then 2, ..., 5, so severity ``s`` is rows ``[(s - 1) n, s n)``; ``<root>/labels.npy`` holds ``5 n``
    (or ``n``) integer labels.

    Args:
        root: the folder.
        corruption, severity: which file and which fifth of it.
        image_shape: expected ``(C, H, W)`` (the datamodule's clean images); ``None`` accepts any.

    Returns:
        ``images`` uint8 ``[n, C, H, W]`` and ``labels`` int64 ``[n]``.

    Raises:
        MissingDataError: the folder or a file is missing.
        DataFormatError: a file is not an ``.npy`` array of the layout above.
    """
    check_corruption(corruption, severity)
    root = Path(root).expanduser()
    paths = [root / f"{corruption}.npy", root / "labels.npy"]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise MissingDataError(f"missing CIFAR-10-C file(s): {', '.join(missing)}. {CIFAR_C_HOW_TO_GET}")
    arrays = []
    for p in paths:
        try:
            arrays.append(np.load(p, mmap_mode="r", allow_pickle=False))
        except Exception as err:  # noqa: BLE001 - any reader failure is one line naming the file
            raise DataFormatError(f"{p}: not a .npy array ({type(err).__name__}: {err})") from None
    images, labels = arrays
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or images.dtype != np.uint8 or len(images) % 5 or images.shape[-1] not in (1, 3):
        raise DataFormatError(
            f"{paths[0]}: {images.dtype} {list(images.shape)}, expected uint8 [5n, H, W, C] (C = 1 or 3): the n test "
            "images at severities 1..5 stacked"
        )
    n = len(images) // 5
    got = (images.shape[3], images.shape[1], images.shape[2])
    if image_shape is not None and got != tuple(image_shape):
        raise DataFormatError(f"{paths[0]}: images are {list(got)} (C, H, W), the datamodule's are {list(image_shape)}")
    if labels.ndim != 1 or len(labels) not in (n, 5 * n) or not np.issubdtype(labels.dtype, np.integer):
        raise DataFormatError(f"{paths[1]}: {labels.dtype} {list(labels.shape)}, expected {5 * n} (or {n}) integers")
    rows = slice((severity - 1) * n, severity * n)
    x = torch.from_numpy(np.ascontiguousarray(images[rows]).transpose(0, 3, 1, 2).copy())
    y = torch.from_numpy(np.asarray(labels[rows] if len(labels) == 5 * n else labels).astype(np.int64))
    return x, y


TEST_ORDERS = ("by_class",)


def order_by_class(labels: torch.Tensor) -> torch.Tensor:
    """Indices ``[N]`` that sort a stream by class, keeping the given order within each class: an online label
    shift of unbounded imbalance (SAR's "online imbalanced label distribution shift" at ratio infinity; Niu et al.,
    ICLR 2023, Sec. 5), where every test batch holds one or two classes and test-batch statistics see a skewed
    label distribution."""
    return torch.sort(labels, stable=True).indices


class CorruptibleImages:
    """Mixin for an image :class:`~datamodules._base.SuiteDataModule`: ``corruption`` / ``severity`` /
    ``corruption_dir`` corrupt its test split; ``test_order=by_class`` streams it sorted by class (a label shift).

    The datamodule calls :meth:`init_corruption` in its constructor, then, when it builds the test images, either
    :meth:`read_corrupted_test` (a CIFAR-10-C folder was given: the files replace the clean test set) or
    :meth:`corrupt_test` (the suite corrupts the clean test images, seeded by ``seed``), and :meth:`order_test`.
    """

    corruption: str | None = None
    severity: int = 5
    corruption_dir: str | None = None
    test_order: str | None = None

    def init_corruption(
        self, corruption: str | None, severity: int, corruption_dir: str | None, test_order: str | None = None
    ) -> None:
        """Validate and store the options (one-line :class:`ConfigError` naming the key)."""
        check_corruption(corruption, severity)
        if corruption_dir is not None and corruption is None:
            raise ConfigError(f"data.corruption_dir={corruption_dir} needs data.corruption (which .npy to read)")
        if test_order is not None and test_order not in TEST_ORDERS:
            raise ConfigError(f"data.test_order={test_order!r} must be null or one of {list(TEST_ORDERS)}")
        self.corruption, self.severity, self.corruption_dir = corruption, int(severity), corruption_dir
        self.test_order = test_order

    def order_test(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The test images and labels in stream order: unchanged, or sorted by class (``test_order=by_class``)."""
        if self.test_order != "by_class":
            return images, labels
        idx = order_by_class(labels)
        return images[idx], labels[idx]

    def read_corrupted_test(self, image_shape: tuple[int, int, int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(uint8 [n, C, H, W], int64 [n])`` from ``corruption_dir``, or ``None`` when no folder is set."""
        if self.corruption_dir is None or self.corruption is None:
            return None
        return load_cifar_c(self.corruption_dir, self.corruption, self.severity, image_shape)

    def corrupt_test(self, images: torch.Tensor) -> torch.Tensor:
        """The test images (uint8 ``[N, (C,) H, W]`` or float in ``[0, 1]``) as float ``[N, C, H, W]``, corrupted
        unless no corruption is set or they came from ``corruption_dir`` (returned unchanged then)."""
        if self.corruption is None or self.corruption_dir is not None:
            return images
        x = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
        if x.dim() == 3:
            x = x.unsqueeze(1)
        seed = int(getattr(self, "seed", 0))
        return corrupt(x, self.corruption, self.severity, seed=seed * 1000 + 17 + CORRUPTIONS.index(self.corruption))
