"""MDA: Metric-Driven Attribution for vision transformers (Walker, Jha & Ewetz, ICLR 2025), as pure functions.

Algorithm (paper Sec. 3; official ``MDAFunctions.MDA``):

1. **Patches.** SLIC superpixels with a huge compactness (an almost regular grid of ``P`` segments,
   :func:`slic_segments`), and a prior attribution averaged per segment after a ``sqrt(P) x sqrt(P)`` down-sampling
   (:func:`prior_per_segment`; the paper's prior is the Bidirectional attribution).
2. **Patch order** (Sec. 3.1). *Insertion search*: from the blurred image, greedily paste the segment that maximises
   the target probability among the ``w = min(2 floor(sqrt P), 28)`` highest-prior unchosen segments, until the
   normalised response ``(p - p_blur) / |p_orig - p_blur|`` reaches the cutoff ``tau``. *Deletion search*: from black,
   greedily paste the segment that *minimises* the probability among the ``w`` lowest-prior unchosen segments (the
   insertion prefix excluded), then paste the prefix in reverse; reversed, this worst insertion order is the best
   deletion order. Each step's ``w`` candidates are scored in one batched forward pass (:func:`greedy_patch_order`;
   :func:`greedy_patch_order_naive` is the one-by-one twin).
3. **Patch magnitude** (Sec. 3.2). The deletion curve is normalised and made monotone, projected onto convex curves
   (:func:`~ops.attribution.projection.normalize_curve`), and its drops ``D_i = x_{i-1} - x_i`` become patch scores
   ``a_i = D_i / |seg_i| + D_i (P - i) / P`` (:func:`magnitudes_from_curve`). The map is re-scored with MAS insertion
   (blur) and deletion (black); ``c = 1 - mean(ins, 1 - del)`` is projected again and gives the final scores.
4. **Sparse / dense** (Sec. 3.3). Dense scores ``(P - i) / P`` where ``a_i >= kappa`` (else ``a_i``), rescaled to the
   sparse maximum; the output blends ``(1 - gamma) sparse + gamma dense``; "smooth" variants down/up-resize the map.

Official-code quirks behind ``official_quirks=True`` (default ``False`` implements the paper):

* the insertion prefix handed to the deletion search ends at the first *raw* softmax ``>= 0.9`` of the response list,
  where the early exit wrote the cutoff value, in the shrinking-window phase at the wrong index (the step within
  that phase instead of the global step); the paper hands over the whole prefix found by the ``tau`` search;
* the deletion curve is ``flip([r_1, ..., r_P, p_orig])``: it starts with ``p_orig`` twice and never reaches the
  black image's response (off by one); the paper's curve is ``[p_orig, r_{P-1}, ..., r_1, p_black]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from core.errors import ConfigError
from ops.attribution.metrics import blur, mas_single_run, monotone_normalize, probabilities, segment_means
from ops.attribution.projection import normalize_curve

ModelFn = Callable[[torch.Tensor], torch.Tensor]


class CountingModel:
    """Wraps ``model_fn`` and counts images (``images``) and calls (``calls``) it was run on."""

    def __init__(self, model_fn: ModelFn) -> None:
        self.model_fn, self.images, self.calls = model_fn, 0, 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.images += len(x)
        self.calls += 1
        return self.model_fn(x)


def window_size(p: int) -> int:
    """Candidate window ``w = min(2 floor(sqrt(P)), 28)`` (official ``subsearch_len``)."""
    return min(2 * int(math.isqrt(p)), 28)


def slic_segments(img: torch.Tensor, n_segments: int, compactness: float = 10000.0) -> torch.Tensor:
    """SLIC superpixels of ``img`` ``[C, H, W]`` (scikit-image), relabelled ``0..P-1``; ``LongTensor [H, W]``.

    With the official compactness 10000 the segments form an almost regular grid.

    Raises:
        ConfigError: ``n_segments`` outside ``[2, H*W]`` or not a perfect square (the prior is pooled on a
            ``sqrt(P) x sqrt(P)`` grid).
    """
    from skimage.segmentation import slic

    c, h, w = img.shape
    if not 2 <= n_segments <= h * w:
        raise ConfigError(f"patch count {n_segments} does not fit a {h}x{w} image (need 2 <= P <= {h * w})")
    if math.isqrt(n_segments) ** 2 != n_segments:
        raise ConfigError(f"patch count {n_segments} must be a perfect square (the prior is pooled on a grid)")
    arr = img.detach().double().cpu().numpy()
    arr = arr[0] if c == 1 else np.transpose(arr, (1, 2, 0))
    seg = slic(arr, n_segments=n_segments, compactness=compactness, start_label=0, channel_axis=None if c == 1 else -1)
    _, relabel = np.unique(seg, return_inverse=True)
    return torch.from_numpy(relabel.reshape(h, w).astype(np.int64))


def prior_per_segment(prior_map: torch.Tensor, segments: torch.Tensor, patch_count: int) -> torch.Tensor:
    """Prior score per segment ``[P]``: the map area-pooled to ``sqrt(P)^2``, nearest-upsampled, segment-averaged."""
    h, w = prior_map.shape
    side = math.isqrt(patch_count)
    small = F.interpolate(prior_map.double().abs()[None, None], size=(side, side), mode="area")
    big = F.interpolate(small, size=(h, w), mode="nearest-exact")[0, 0]
    return segment_means(big, segments)


def calibrate_blur(
    model_fn: ModelFn,
    img: torch.Tensor,
    target: int,
    klen_start: int = 31,
    klen_step: int = 2,
    klen_max: int = 101,
    max_conf: float = 0.01,
) -> tuple[torch.Tensor, int] | None:
    """Grow the Gaussian kernel (``klen = nsig``) until the blurred image's target probability is ``<= max_conf``.

    Returns ``(blurred [C, H, W], klen)``, or ``None`` when ``klen`` passes ``klen_max`` (the image is skipped).
    """
    klen = klen_start
    while klen <= klen_max:
        b = blur(img, klen, klen)
        if float(probabilities(model_fn, b[None], target)[0]) <= max_conf:
            return b, klen
        klen += klen_step
    return None


@dataclass
class SearchResult:
    """Committed segments in order, raw target probability after each commit, and where the cutoff hit."""

    order: list[int]
    responses: list[float]
    stopped_at: int | None = None  # global step of the early exit (None: ran to the end)
    phase2_step: int | None = None  # step within the shrinking-window phase at the exit (None: first phase)
    extra: dict = field(default_factory=dict)


def _greedy(
    score_fn: Callable[[torch.Tensor, torch.Tensor], np.ndarray],
    start: torch.Tensor,
    finish: torch.Tensor,
    segments: torch.Tensor,
    candidate_order: list[int],
    window: int,
    maximize: bool,
    n_steps: int | None,
    stop: Callable[[float], bool] | None,
) -> tuple[SearchResult, torch.Tensor]:
    remaining = list(candidate_order)
    n_total = len(remaining)
    n_steps = n_total if n_steps is None else n_steps
    current = start.clone()
    res = SearchResult([], [])
    for step in range(n_steps):
        k = min(window, len(remaining))
        cands = torch.tensor(remaining[:k], dtype=torch.long)
        probs = score_fn(current, cands)
        j = int(np.argmax(probs) if maximize else np.argmin(probs))  # first best on ties (deterministic)
        seg = int(cands[j])
        current = torch.where(segments[None] == seg, finish, current)
        remaining.remove(seg)
        res.order.append(seg)
        res.responses.append(float(probs[j]))
        if stop is not None and stop(float(probs[j])):
            res.stopped_at = step
            first_phase = n_total - window
            res.phase2_step = None if step < first_phase else step - max(first_phase, 0)
            break
    return res, current


def segment_pixels(segments: torch.Tensor) -> list[torch.Tensor]:
    """Flat pixel indices of every segment ``0..P-1`` of ``segments`` ``[H, W]`` (computed once per search)."""
    flat = segments.reshape(-1)
    p = int(flat.max()) + 1
    order = torch.argsort(flat, stable=True)
    return list(torch.split(order, torch.bincount(flat, minlength=p).tolist()))


def greedy_patch_order(
    model_fn: ModelFn,
    start: torch.Tensor,
    finish: torch.Tensor,
    segments: torch.Tensor,
    candidate_order: list[int],
    window: int,
    maximize: bool,
    target: int,
    n_steps: int | None = None,
    stop: Callable[[float], bool] | None = None,
) -> tuple[SearchResult, torch.Tensor]:
    """Greedy patch search, the window's candidates scored in **one batched forward pass** per step.

    At each step the first ``min(window, remaining)`` unchosen segments of ``candidate_order`` are pasted one at a
    time from ``finish`` into the current image (``start`` at first); the segment whose image gives the highest
    (``maximize``) or lowest target probability is committed (the first on ties). ``stop(p)`` ends the search early
    after a commit.

    The fast path: segment pixel indices are computed once, the candidate batch lives in one reused buffer filled by
    a broadcast copy of the current image and **one** indexed write of all candidates' pixels, and the search runs
    under ``torch.inference_mode``. :func:`greedy_patch_order_naive` is the one-by-one twin (same result).

    Args:
        start, finish: ``[C, H, W]``; segments: ``[H, W]`` labels; candidate_order: segment ids in search order.

    Returns:
        ``(SearchResult, final image [C, H, W])``.
    """
    c, h, w = start.shape
    remaining = list(candidate_order)
    n_total = len(remaining)
    n_steps = n_total if n_steps is None else n_steps
    res = SearchResult([], [])
    with torch.inference_mode():
        pix = segment_pixels(segments.to(start.device))
        sizes = torch.tensor([len(q) for q in pix])
        fin = finish.reshape(c, h * w)
        cur = start.reshape(c, h * w).clone()
        buf = torch.empty(max(1, min(window, n_total)), c, h * w, dtype=start.dtype, device=start.device)
        for step in range(n_steps):
            k = min(window, len(remaining))
            cands = remaining[:k]
            batch = buf[:k]
            batch.copy_(cur.expand(k, c, h * w))
            rows = torch.repeat_interleave(torch.arange(k), sizes[cands]).to(start.device)
            cols = torch.cat([pix[s] for s in cands])
            batch[rows, :, cols] = fin[:, cols].T  # every candidate's segment pasted in one indexed write
            probs = model_fn(batch.view(k, c, h, w))[:, target].double()
            j = int(probs.argmax() if maximize else probs.argmin())
            seg = cands[j]
            cur[:, pix[seg]] = fin[:, pix[seg]]
            remaining.remove(seg)
            res.order.append(seg)
            res.responses.append(float(probs[j]))
            if stop is not None and stop(float(probs[j])):
                res.stopped_at = step
                first_phase = n_total - window
                res.phase2_step = None if step < first_phase else step - max(first_phase, 0)
                break
    return res, cur.reshape(c, h, w).clone()


def greedy_patch_order_naive(
    model_fn: ModelFn,
    start: torch.Tensor,
    finish: torch.Tensor,
    segments: torch.Tensor,
    candidate_order: list[int],
    window: int,
    maximize: bool,
    target: int,
    n_steps: int | None = None,
    stop: Callable[[float], bool] | None = None,
) -> tuple[SearchResult, torch.Tensor]:
    """Twin of :func:`greedy_patch_order`: each candidate image built and scored on its own (one forward each)."""

    def score(current: torch.Tensor, cands: torch.Tensor) -> np.ndarray:
        out = []
        for seg in cands.tolist():
            img = current.clone()
            img[:, segments == seg] = finish[:, segments == seg]
            out.append(float(probabilities(model_fn, img[None], target)[0]))
        return np.array(out)

    return _greedy(score, start, finish, segments, candidate_order, window, maximize, n_steps, stop)


def magnitudes_from_curve(order: list[int], curve: np.ndarray, seg_sizes: torch.Tensor) -> torch.Tensor:
    """Patch scores from a projected deletion curve (Sec. 3.2): ``a_i = D_i / |seg_i| + D_i (P - i) / P``.

    ``order``: segments in deletion order (``P``); ``curve``: ``[P + 1]``; returns scores per segment id ``[P]``.
    """
    p = len(order)
    if len(curve) != p + 1:
        raise ConfigError(f"deletion curve has {len(curve)} points, expected P + 1 = {p + 1}")
    out = torch.zeros(p, dtype=torch.float64)
    for i in range(1, p + 1):
        d = float(curve[i - 1] - curve[i])
        seg = order[i - 1]
        out[seg] = d / float(seg_sizes[seg]) + d * (p - i) / p
    return out


def dense_scores(order: list[int], sparse: torch.Tensor, kappa: float) -> torch.Tensor:
    """Dense scores (Sec. 3.3): ``(P - i) / P`` for the ``i``-th deleted segment when ``a_i >= kappa``, else ``a_i``,
    rescaled so that its maximum equals the sparse maximum."""
    p = len(order)
    dense = sparse.clone()
    for i in range(1, p + 1):
        seg = order[i - 1]
        if sparse[seg] >= kappa:
            dense[seg] = (p - i) / p
    mx = float(dense.max())
    return dense / mx * float(sparse.max()) if mx > 0 else dense


def smooth_map(m: torch.Tensor, patch_count: int) -> torch.Tensor:
    """The "smooth" variant: bilinear (antialiased) down-resize to ``ceil(sqrt P)`` and back up. ``[H, W]``."""
    h, w = m.shape
    side = math.ceil(math.sqrt(patch_count))
    small = F.interpolate(m[None, None].double(), size=(side, side), mode="bilinear", antialias=True)
    return F.interpolate(small, size=(h, w), mode="bilinear", align_corners=False)[0, 0]


@dataclass
class MDAResult:
    """MDA's maps ``[H, W]`` per ``gamma`` (``maps``) and smoothed (``smooth``), plus what the search found."""

    maps: dict[float, torch.Tensor]
    smooth: dict[float, torch.Tensor]
    deletion_order: list[int]
    insertion_prefix: list[int]
    curve_first: np.ndarray  # projected deletion curve of the searched order
    curve_rescored: np.ndarray  # projected MAS re-scored curve
    segments: torch.Tensor
    blur_klen: int
    forward_images: int = 0


def _insertion_prefix(
    ins: SearchResult, p: int, window: int, cutoff: float, p_blur: float, p_orig: float, official_quirks: bool
) -> list[int]:
    if not official_quirks:
        return ins.order
    # Official: MR list (raw softmax) with `cutoff` written at the exit step, at the wrong index in phase 2;
    # the unwritten tail is uninitialised memory (treated as never >= 0.9); prefix ends at the first value >= 0.9.
    if ins.stopped_at is None:
        # no early exit: the official function returns the normalised curve with the blur point prepended
        raw = np.array([p_blur, *ins.responses])
        with np.errstate(divide="ignore", invalid="ignore"):
            mr = np.maximum.accumulate(np.clip((raw - p_blur) / abs(p_orig - p_blur), 0, 1))
    else:
        mr = np.full(p, -np.inf)
        mr[: len(ins.responses)] = ins.responses
        mr[ins.stopped_at if ins.phase2_step is None else ins.phase2_step] = cutoff
    hits = np.nonzero(mr >= 0.9)[0]
    end = int(hits[0]) if len(hits) else len(ins.order) - 1
    return ins.order[: end + 1]


def mda(
    model_fn: ModelFn,
    img: torch.Tensor,
    prior_map: torch.Tensor,
    patch_count: int,
    target: int | None = None,
    cutoff: float = 0.9,
    kappa: float = 0.005,
    gammas: tuple[float, ...] = (0.0, 0.5, 1.0),
    compactness: float = 10000.0,
    blur_klen: tuple[int, int, int] = (31, 2, 101),
    blur_max_conf: float = 0.01,
    mas_step: int | None = None,
    official_quirks: bool = False,
    batched: bool = True,
    segments: torch.Tensor | None = None,
    window: int | None = None,
    blurred: tuple[torch.Tensor, int] | None = None,
) -> MDAResult | None:
    """Run MDA on one image ``[C, H, W]`` with a prior attribution ``[H, W]``; ``None`` if the blur calibration fails.

    Args:
        model_fn: images ``[B, C, H, W]`` -> probabilities ``[B, K]``.
        patch_count: SLIC segments ``P`` (a perfect square; 196 for /16 ViTs at 224 px, 49 here).
        target: explained class (default: the model's argmax).
        cutoff: ``tau`` of the insertion search (0: empty prefix, 1: no early exit, official conventions).
        kappa, gammas: dense threshold and sparse/dense blend weights (Sec. 3.3).
        blur_klen: ``(start, step, max)`` of the blur kernel growth; blur_max_conf: stop probability (1%).
        mas_step: pixels per MAS re-scoring step (default: the image width, 224 in the paper).
        official_quirks: reproduce the official code's index quirks (module docstring).
        batched: score the candidate window in one forward pass (``False``: the one-by-one twin).
        segments: precomputed segment labels ``[H, W]`` (``0..P-1``) instead of SLIC (e.g. the exact ViT grid).
        window: candidate window (default :func:`window_size`, the paper's ``min(2 floor(sqrt P), 28)``).
        blurred: ``(blurred image, klen)`` from :func:`calibrate_blur` for this image and target, to reuse instead
            of calibrating again (callers that already calibrated, e.g. several MDA variants of one image).
    """
    counter = CountingModel(model_fn)
    c, h, w = img.shape
    if not 0.0 <= cutoff <= 1.0:
        raise ConfigError(f"MDA cutoff tau={cutoff} must be in [0, 1]")
    if tuple(prior_map.shape) != (h, w):
        raise ConfigError(f"prior saliency map has shape {list(prior_map.shape)}, expected [H, W] = {[h, w]}")
    with torch.no_grad():
        target = int(counter(img[None]).argmax(1)) if target is None else target
    cal = blurred if blurred is not None else calibrate_blur(counter, img, target, *blur_klen, max_conf=blur_max_conf)
    if cal is None:
        return None
    blurred, klen = cal
    black = torch.zeros_like(img)
    if segments is None:
        segments = slic_segments(img, patch_count, compactness)
    elif tuple(segments.shape) != (h, w):
        raise ConfigError(f"segments have shape {list(segments.shape)}, expected [H, W] = {[h, w]}")
    segments = segments.to(img.device)  # pasting happens on the image's device; SLIC returns CPU labels
    p = int(segments.max()) + 1
    seg_sizes = torch.bincount(segments.reshape(-1), minlength=p)
    prior = (
        prior_per_segment(prior_map, segments, patch_count)
        if p == patch_count
        else segment_means(prior_map.double().abs(), segments)
    )
    if window is None:
        window = window_size(p)
    elif not 1 <= window <= p:
        raise ConfigError(f"MDA window={window} must be in [1, P={p}]")
    p_orig, p_blur, p_black = (float(v) for v in probabilities(counter, torch.stack([img, blurred, black]), target))
    search = greedy_patch_order if batched else greedy_patch_order_naive

    # Step 1a: insertion search (highest prior first, maximise, stop at the normalised cutoff).
    desc = torch.sort(-prior, stable=True).indices.tolist()
    if cutoff == 0.0:
        ins = SearchResult([], [])
    else:
        denom = abs(p_orig - p_blur)

        def stop(pr: float) -> bool:
            return cutoff != 1.0 and denom > 0 and (pr - p_blur) / denom >= cutoff

        ins, _ = search(counter, blurred, img, segments, desc, window, True, target, stop=stop)
    prefix = _insertion_prefix(ins, p, window, cutoff, p_blur, p_orig, official_quirks)

    # Step 1b: deletion search = worst insertion from black over the lowest-prior non-prefix segments.
    asc = [s for s in torch.sort(prior, stable=True).indices.tolist() if s not in set(prefix)]
    worst, current = search(counter, black, img, segments, asc, window, False, target)
    responses = list(worst.responses)
    for seg in reversed(prefix):  # the best insertion patches go last (most important inserted last)
        current = torch.where(segments[None] == seg, img, current)
        responses.append(float(probabilities(counter, current[None], target)[0]))
    worst_order = worst.order + list(reversed(prefix))
    deletion_order = worst_order[::-1]
    r = np.array(responses)  # r[k-1]: after k insertions from black
    raw = np.concatenate([[p_orig], r[::-1]]) if official_quirks else np.concatenate([[p_orig], r[-2::-1], [p_black]])

    # Step 2: magnitudes from the projected, monotone normalised deletion curve.

    y = monotone_normalize(raw, p_black, p_orig, "del")
    y = np.nan_to_num(y, nan=0.0, posinf=1.0, neginf=0.0)
    x1 = normalize_curve(y, 0)
    attr = magnitudes_from_curve(deletion_order, x1, seg_sizes)
    m1 = attr[segments.cpu()]
    # MAS re-scoring (insertion on blur, deletion on black), interpolated to P + 1 points.
    step = w if mas_step is None else mas_step
    _, _, _, _, ins_n = mas_single_run(counter, img, m1, "ins", blurred, step, target)
    _, _, _, _, del_n = mas_single_run(counter, img, m1, "del", black, step, target)
    grid_old, grid_new = np.linspace(0, 100, len(ins_n)), np.linspace(0, 100, p + 1)
    ins_i, del_i = np.interp(grid_new, grid_old, ins_n), np.interp(grid_new, grid_old, del_n)
    c2 = 1.0 - np.mean([ins_i, 1.0 - del_i], axis=0)
    x2 = normalize_curve(np.nan_to_num(c2, nan=0.0).clip(0, 1), 0)
    sparse = magnitudes_from_curve(deletion_order, x2, seg_sizes)
    dense = dense_scores(deletion_order, sparse, kappa)
    seg_cpu = segments.cpu()
    maps = {g: ((1 - g) * sparse + g * dense)[seg_cpu] for g in gammas}
    smooth = {g: smooth_map(mp, p) for g, mp in maps.items()}
    return MDAResult(maps, smooth, deletion_order, list(prefix), x1, x2, segments, klen, counter.images)
