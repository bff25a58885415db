"""Attribution-quality metrics as pure functions (what MDA optimises and what it is scored on).

Conventions: ``model_fn`` maps images ``[B, C, H, W]`` to class probabilities ``[B, K]`` (softmax already applied);
``img`` is one image ``[C, H, W]``; ``saliency`` is ``[H, W]`` (higher = more important); ``substrate`` is an image
``[C, H, W]`` the pixels are replaced with (black, blurred, mean colour). Curves have ``n + 1`` points, point 0 being
the start image and point ``n`` the finished one.

* RISE insertion / deletion (Petsiuk et al., 2018): raw target probability while the most salient pixels are
  inserted into the substrate (or deleted into it), ``step`` pixels at a time (:func:`rise_curve`). Scored two ways:
  :func:`auc` of that raw curve (Petsiuk's convention), or, as the official MDA test does (``MDATest.py``: "Rise
  Ins" is ``auc`` of ``single_run``'s ``normalized_model_response``), :func:`auc` of the clipped, running-max/min
  normalised curve that :func:`mas_single_run` returns last.
* MAS (Walker et al., IJCAI 2024, the official ``MASMetric.single_run``): the curve is normalised and made monotone
  (:func:`monotone_normalize`), then penalised by its misalignment with the attribution mass moved so far.
* Monotonicity (the official ``MonotonicityTest``): Spearman correlation of the raw curve with a linear ramp, patch
  by patch (:func:`monotonicity`, the metric's ``patch_mask`` form) or ``step`` pixels at a time
  (:func:`pixel_monotonicity`, the maskless form the official evaluation script calls).
* Positive / negative perturbation (Chefer et al., 2021): top-1 correctness while 0, 10, ..., 90% of the pixels, most
  (positive) or least (negative) salient first, are set to the substrate; the score is :func:`auc` of that curve.
* Localisation (held out from MDA's search): pointing game and IoU of the top-k patches against a ground-truth mask.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from core.errors import ConfigError

ModelFn = Callable[[torch.Tensor], torch.Tensor]


def auc(arr: np.ndarray | torch.Tensor) -> float:
    """Normalised trapezoid area of a curve on an even grid over ``[0, 1]`` (official ``auc``).

    ``(sum(a) - a[0] / 2 - a[-1] / 2) / (n - 1)`` for ``n`` points.
    """
    a = np.asarray(arr, dtype=np.float64).reshape(-1)
    if a.size < 2:
        raise ConfigError(f"auc needs a curve of at least 2 points, got {a.size}")
    return float((a.sum() - a[0] / 2 - a[-1] / 2) / (a.size - 1))


def gkern(klen: int, nsig: float, channels: int = 3) -> torch.Tensor:
    """Gaussian blur kernel ``[C, C, klen, klen]`` (channel-diagonal), the official ``gkern``.

    A Dirac at the centre of a ``klen x klen`` grid smoothed by ``scipy.ndimage.gaussian_filter`` with sigma ``nsig``
    (so the kernel is truncated by the grid and sums to at most 1).
    """
    from scipy.ndimage import gaussian_filter

    if klen < 1 or klen % 2 == 0:
        raise ConfigError(f"gkern klen={klen} must be a positive odd integer")
    inp = np.zeros((klen, klen))
    inp[klen // 2, klen // 2] = 1.0
    k = gaussian_filter(inp, nsig)
    kern = np.zeros((channels, channels, klen, klen))
    for c in range(channels):
        kern[c, c] = k
    return torch.from_numpy(kern)


def blur(img: torch.Tensor, klen: int, nsig: float) -> torch.Tensor:
    """Blur ``img`` ``[C, H, W]`` or ``[B, C, H, W]`` with :func:`gkern` (zero padding ``klen // 2``, as official)."""
    x = img if img.dim() == 4 else img[None]
    k = gkern(klen, nsig, x.shape[1]).to(x)
    out = F.conv2d(x, k, padding=klen // 2)
    return out if img.dim() == 4 else out[0]


def check_saliency(img: torch.Tensor, saliency: torch.Tensor | np.ndarray) -> torch.Tensor:
    """``saliency`` as a float64 ``[H, W]`` tensor matching ``img`` ``[C, H, W]``; a clear error otherwise."""
    s = torch.as_tensor(np.asarray(saliency) if not torch.is_tensor(saliency) else saliency)
    if img.dim() != 3:
        raise ConfigError(f"image must be [C, H, W], got shape {list(img.shape)}")
    if s.dim() == 3 and s.shape[0] == 1:
        s = s[0]
    if tuple(s.shape) != tuple(img.shape[-2:]):
        raise ConfigError(f"saliency map has shape {list(s.shape)}, expected [H, W] = {list(img.shape[-2:])}")
    if not bool(torch.isfinite(s).all()):
        raise ConfigError("saliency map has non-finite values")
    return s.double().to(img.device)


def salient_rank(saliency: torch.Tensor) -> torch.Tensor:
    """Rank of every pixel in decreasing saliency (0 = most salient), ties broken by pixel index. ``[H*W]``."""
    flat = saliency.reshape(-1)
    # argsort of -s with a stable sort: equal values keep the raster order (deterministic, documented).
    order = torch.sort(-flat, stable=True).indices
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order))
    return rank


def path_images(start: torch.Tensor, finish: torch.Tensor, rank: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Images where the ``counts[b]`` lowest-ranked pixels come from ``finish`` and the rest from ``start``.

    ``start``/``finish``: ``[C, H, W]``; ``rank``: ``[H*W]``; ``counts``: ``[B]``. Returns ``[B, C, H, W]``.
    """
    c, h, w = start.shape
    mask = (rank[None, :] < counts[:, None]).reshape(-1, 1, h, w)
    return torch.where(mask, finish[None], start[None])


@torch.no_grad()
def probabilities(model_fn: ModelFn, images: torch.Tensor, target: int, batch_size: int = 64) -> np.ndarray:
    """Target-class probability of each image ``[N, C, H, W]`` in chunks of ``batch_size``; float64 ``[N]``."""
    out = [model_fn(images[i : i + batch_size])[:, target] for i in range(0, len(images), batch_size)]
    return torch.cat(out).double().cpu().numpy()


def causal_curve(
    model_fn: ModelFn,
    img: torch.Tensor,
    saliency: torch.Tensor,
    mode: str,
    substrate: torch.Tensor,
    step: int,
    target: int,
    batch_size: int = 64,
) -> np.ndarray:
    """Raw target probability along the insertion (``ins``) or deletion (``del``) path, ``[n + 1]``.

    ``n = ceil(H*W / step)``. Insertion starts from ``substrate`` and pastes the most salient pixels of ``img``;
    deletion starts from ``img`` and replaces the most salient pixels with ``substrate``.
    """
    if mode not in ("ins", "del"):
        raise ConfigError(f"mode={mode!r} must be 'ins' or 'del'")
    s = check_saliency(img, saliency)
    hw = s.numel()
    if step < 1:
        raise ConfigError(f"step={step} must be >= 1 pixel")
    n = (hw + step - 1) // step
    start, finish = (substrate, img) if mode == "ins" else (img, substrate)
    counts = torch.arange(n + 1) * step
    images = path_images(start.to(img), finish.to(img), salient_rank(s), counts)
    return probabilities(model_fn, images, target, batch_size)


def rise_curve(model_fn, img, saliency, mode, substrate, step, target, batch_size=64) -> np.ndarray:
    """RISE insertion/deletion curve (raw probabilities): :func:`causal_curve`; its score is ``auc``."""
    return causal_curve(model_fn, img, saliency, mode, substrate, step, target, batch_size)


def monotone_normalize(raw: np.ndarray, p_substrate: float, p_orig: float, mode: str) -> np.ndarray:
    """Normalise a raw curve to ``[0, 1]`` and make it monotone (official ``MASMetric`` / MDA searches).

    ``y_i = clip((raw_i - p_substrate) / |p_orig - p_substrate|, 0, 1)``, then a running maximum (``ins``,
    non-decreasing from 0) or running minimum (``del``, non-increasing from 1), each started at the neutral bound.
    A zero denominator gives the official ``nan``/``inf`` values, which callers handle.
    """
    if mode not in ("ins", "del"):
        raise ConfigError(f"mode={mode!r} must be 'ins' or 'del'")
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.clip((np.asarray(raw, dtype=np.float64) - p_substrate) / abs(p_orig - p_substrate), 0.0, 1.0)
    if mode == "ins":
        return np.maximum.accumulate(np.concatenate([[0.0], y]))[1:]
    return np.minimum.accumulate(np.concatenate([[1.0], y]))[1:]


def density_curve(saliency: torch.Tensor, step: int, mode: str) -> np.ndarray:
    """Share of the attribution mass moved after each step, ``[n + 1]`` (MAS ``density_response``).

    Insertion: ``0, m_1, m_1 + m_2, ...``; deletion: ``1, 1 - m_1, ...``, with ``m_k`` the saliency of the ``k``-th
    block of ``step`` most salient pixels over the total.
    """
    flat = saliency.reshape(-1).double().cpu()
    ordered = flat[torch.sort(-flat, stable=True).indices]
    n = (len(flat) + step - 1) // step
    blocks = torch.zeros(n, dtype=torch.float64)
    blocks.index_add_(0, torch.arange(len(flat)) // step, ordered)
    with np.errstate(divide="ignore", invalid="ignore"):
        cum = np.concatenate([[0.0], np.cumsum(blocks.numpy()) / float(flat.sum())])
    return cum if mode == "ins" else 1.0 - cum


def mas_single_run(
    model_fn: ModelFn,
    img: torch.Tensor,
    saliency: torch.Tensor,
    mode: str,
    substrate: torch.Tensor,
    step: int,
    target: int | None = None,
    batch_size: int = 64,
) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """MAS insertion/deletion (official ``MASMetric.single_run``).

    Returns ``(n + 1, corrected, penalty, density, normalized)``: the monotone normalised curve ``normalized``, the
    attribution mass curve ``density``, ``penalty = |normalized - density|`` and ``corrected = normalized -/+
    penalty`` (insertion / deletion), clipped to ``[0, 1]`` and min-max rescaled; a degenerate rescale falls back to
    a linear ramp (official behaviour).
    """
    s = check_saliency(img, saliency)
    target = int(model_fn(img[None]).argmax(1)) if target is None else target
    p_orig = float(probabilities(model_fn, img[None], target)[0])
    p_sub = float(probabilities(model_fn, substrate[None].to(img), target)[0])
    raw = causal_curve(model_fn, img, s, mode, substrate, step, target, batch_size)
    raw[0] = p_sub if mode == "ins" else p_orig
    normalized = monotone_normalize(raw, p_sub, p_orig, mode)
    density = density_curve(s, step, mode)
    penalty = np.abs(normalized - density)
    corrected = (normalized - penalty) if mode == "ins" else (normalized + penalty)
    corrected = corrected.clip(0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        corrected = (corrected - corrected.min()) / (corrected.max() - corrected.min())
    if np.isnan(corrected).any():
        n1 = len(raw)
        corrected = np.linspace(0, 1, n1) if mode == "ins" else np.linspace(1, 0, n1)
    return len(raw), corrected, penalty, density, normalized


def ramp_spearman(raw: np.ndarray, mode: str) -> float:
    """Spearman's rho of a raw curve ``[n + 1]`` with ``linspace(0, 1)`` (``positive``) or ``linspace(1, 0)``
    (``negative``), the official monotonicity score; a constant curve (undefined rho) scores 0."""
    from scipy.stats import spearmanr

    if mode not in ("positive", "negative"):
        raise ConfigError(f"monotonicity mode={mode!r} must be 'positive' or 'negative'")
    raw = np.asarray(raw, dtype=np.float64)
    ramp = np.linspace(0, 1, len(raw)) if mode == "positive" else np.linspace(1, 0, len(raw))
    return float(spearmanr(ramp, raw).correlation) if np.ptp(raw) > 0 else 0.0


def monotonicity(
    model_fn: ModelFn,
    img: torch.Tensor,
    saliency: torch.Tensor,
    mode: str,
    substrate: torch.Tensor,
    target: int,
    segments: torch.Tensor,
    batch_size: int = 64,
) -> tuple[np.ndarray, float]:
    """Patch-wise monotonicity (official ``MonotonicityMetric`` with a patch mask).

    Patches are visited in decreasing mean saliency; ``positive`` inserts them into ``substrate``, ``negative``
    removes them from ``img`` (the official script uses the blur substrate in both modes). Returns the raw curve
    ``[P + 1]`` and :func:`ramp_spearman` of it.
    """
    if mode not in ("positive", "negative"):
        raise ConfigError(f"monotonicity mode={mode!r} must be 'positive' or 'negative'")
    s = check_saliency(img, saliency)
    seg_mean = segment_means(s, segments)
    order = torch.sort(-seg_mean, stable=True).indices
    prank = torch.empty_like(order)
    prank[order] = torch.arange(len(order))
    pix_rank = prank[segments.reshape(-1).long().cpu()].to(img.device)
    p = len(order)
    start, finish = (substrate, img) if mode == "positive" else (img, substrate)
    images = path_images(start.to(img), finish.to(img), pix_rank, torch.arange(p + 1))
    raw = probabilities(model_fn, images, target, batch_size)
    return raw, ramp_spearman(raw, mode)


def pixel_monotonicity(
    model_fn: ModelFn,
    img: torch.Tensor,
    saliency: torch.Tensor,
    mode: str,
    substrate: torch.Tensor,
    step: int,
    target: int,
    batch_size: int = 64,
) -> tuple[np.ndarray, float]:
    """Pixel-step (maskless) monotonicity: the official ``MonotonicityMetric.single_run`` without ``patch_mask``.

    ``step`` pixels at a time in decreasing saliency (the official evaluation passes the image width, 224): the
    ``positive`` curve inserts them into ``substrate`` (it is the raw RISE insertion curve), the ``negative`` curve
    replaces them in ``img`` by ``substrate``. Returns the raw curve ``[ceil(H*W / step) + 1]`` and
    :func:`ramp_spearman` of it.
    """
    if mode not in ("positive", "negative"):
        raise ConfigError(f"monotonicity mode={mode!r} must be 'positive' or 'negative'")
    raw = causal_curve(
        model_fn, img, saliency, "ins" if mode == "positive" else "del", substrate, step, target, batch_size
    )
    return raw, ramp_spearman(raw, mode)


def segment_means(values: torch.Tensor, segments: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` ``[H, W]`` over each segment label ``0..P-1`` of ``segments`` ``[H, W]``; ``[P]``."""
    seg = segments.reshape(-1).long().cpu()
    p = int(seg.max()) + 1
    sums = torch.zeros(p, dtype=torch.float64).index_add_(0, seg, values.reshape(-1).double().cpu())
    cnt = torch.zeros(p, dtype=torch.float64).index_add_(0, seg, torch.ones_like(seg, dtype=torch.float64))
    return sums / cnt.clamp_min(1)


PERTURBATION_FRACTIONS = tuple(i / 10 for i in range(10))


def perturbation_curve(
    model_fn: ModelFn,
    img: torch.Tensor,
    saliency: torch.Tensor,
    mode: str,
    target: int,
    substrate: torch.Tensor | None = None,
    fractions: tuple[float, ...] = PERTURBATION_FRACTIONS,
) -> np.ndarray:
    """Positive / negative perturbation (Chefer et al., 2021): top-1 correctness ``[len(fractions)]``.

    ``positive`` removes the most salient pixels first (lower AUC is better), ``negative`` the least salient first
    (higher is better); removed pixels take ``substrate`` (default black).
    """
    if mode not in ("positive", "negative"):
        raise ConfigError(f"perturbation mode={mode!r} must be 'positive' or 'negative'")
    s = check_saliency(img, saliency)
    sub = torch.zeros_like(img) if substrate is None else substrate.to(img)
    rank = salient_rank(s if mode == "positive" else -s)
    counts = torch.tensor([int(round(f * s.numel())) for f in fractions])
    images = path_images(img, sub, rank, counts)
    with torch.no_grad():
        pred = torch.cat([model_fn(images[i : i + 64]).argmax(1) for i in range(0, len(images), 64)])
    return (pred == target).double().cpu().numpy()


def pointing_game(saliency: torch.Tensor, gt_mask: torch.Tensor) -> float:
    """1.0 when a maximum of ``saliency`` ``[H, W]`` falls inside the boolean ``gt_mask`` ``[H, W]``, else 0.0.

    With piecewise-constant (patch) maps the maximum is often shared by many pixels: a hit is counted when the
    largest value inside the mask equals the global maximum.
    """
    s = torch.as_tensor(saliency).double().cpu()
    m = torch.as_tensor(gt_mask).bool().cpu()
    if s.shape != m.shape:
        raise ConfigError(f"pointing_game: saliency {list(s.shape)} and mask {list(m.shape)} differ in shape")
    if not bool(m.any()):
        raise ConfigError("pointing_game: the ground-truth mask is empty")
    return float(bool(s[m].max() >= s.max()))


def topk_patch_iou(saliency: torch.Tensor, gt_mask: torch.Tensor, patch: int, k: int) -> float:
    """IoU between the ``k`` patches of highest mean saliency and the patches the mask touches (``patch`` px grid)."""
    s = torch.as_tensor(saliency).double()
    m = torch.as_tensor(gt_mask).double()
    h, w = s.shape
    if h % patch or w % patch:
        raise ConfigError(f"topk_patch_iou: patch={patch} does not divide the {h}x{w} map")
    ps = F.avg_pool2d(s.cpu()[None, None], patch).reshape(-1)
    pm = F.max_pool2d(m.cpu()[None, None], patch).reshape(-1) > 0
    if not 1 <= k <= len(ps):
        raise ConfigError(f"topk_patch_iou: k={k} must be in [1, {len(ps)}]")
    top = torch.zeros_like(pm)
    top[torch.sort(-ps, stable=True).indices[:k]] = True
    return float((top & pm).sum() / (top | pm).sum())
