"""The attribution benchmark of MDA's claim: maps of every method on the same images, scored by every metric.

For each clean test image the subject classifies correctly with confidence >= ``min_confidence`` (paper: 60%;
others are skipped and counted, as in the paper) and whose blur calibration succeeds, every method's map is scored
by the metrics MDA optimises (RISE and MAS insertion/deletion on the search substrates blur/black) and the rest of
the paper's metrics (monotonicity, positive/negative perturbation), plus **held-out** metrics MDA never sees:
RISE insertion/deletion on a *mean-colour* substrate and, on images carrying the planted backdoor patch, ground-truth
localisation (pointing game, IoU of the top-k patches) of the trigger.

Conventions (the paper comparison uses the official evaluation's, ``docs/methods/mda.md``):

* ``rise_ins`` / ``rise_del`` / ``rise_insdel``: :func:`~ops.attribution.metrics.auc` of the clipped, running-max
  (insertion) / running-min (deletion) normalised curve, as the official ``MDATest.py`` scores "Rise Ins/Del" (the
  last output of ``mas_single_run``); ``rise_*_raw``: the AUC of the raw probability curve (Petsiuk et al.'s
  convention), an extra column.
* ``mono_pos`` / ``mono_neg``: patch-wise monotonicity, both on the blur substrate as the official script
  (``mono_neg_substrate="black"``: negative mode deletes into black);
  ``mono_pix_pos`` / ``mono_pix_neg``: the official maskless pixel-step monotonicity (``W`` pixels per step, the
  call ``MDATestMonotonicity.py`` makes), an extra column.

Metric keys ``attr/<method>/<metric>`` (means over images); :data:`LOWER_IS_BETTER` lists the metrics where less
is better.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from core.errors import ConfigError
from lightning_modules.mda.baselines import get_baseline
from ops.attribution import metrics as M
from ops.attribution.mda import calibrate_blur, mda

FAITHFULNESS = (
    "rise_ins",
    "rise_del",
    "rise_insdel",
    "mas_ins",
    "mas_del",
    "mas_insdel",
    "mono_pos",
    "mono_neg",
    "pert_pos",
    "pert_neg",
)
EXTRA = ("rise_ins_raw", "rise_del_raw", "rise_insdel_raw", "mono_pix_pos", "mono_pix_neg")
HELD_OUT = ("heldout_rise_ins", "heldout_rise_del", "heldout_rise_insdel", "pointing", "iou_top1", "iou_topk")
LOWER_IS_BETTER = frozenset({"rise_del", "rise_del_raw", "mas_del", "pert_pos", "heldout_rise_del"})
MONO_NEG_SUBSTRATES = ("blur", "black")


def check_mono_neg_substrate(name: str) -> str:
    """``name`` if it is a negative-monotonicity substrate (``blur``: official, ``black``), else a ConfigError."""
    if name not in MONO_NEG_SUBSTRATES:
        raise ConfigError(f"mono_neg_substrate={name!r} must be one of {list(MONO_NEG_SUBSTRATES)}")
    return name


def model_probs(model: nn.Module) -> M.ModelFn:
    """``x -> softmax(model(x))`` without gradients, in the model's dtype."""
    dtype = next(model.parameters()).dtype

    @torch.no_grad()
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(model(x.to(dtype)), dim=1)

    return fn


def patch_grid(h: int, w: int, patch: int) -> torch.Tensor:
    """Segment labels of the ViT patch grid ``[H, W]`` (the patches monotonicity is measured on)."""
    if h % patch or w % patch:
        raise ConfigError(f"patch size {patch} does not divide the {h}x{w} image")
    gw = w // patch
    rows = torch.arange(h) // patch
    cols = torch.arange(w) // patch
    return rows[:, None] * gw + cols[None, :]


def score_map(
    fn: M.ModelFn,
    img: torch.Tensor,
    sal: torch.Tensor,
    target: int,
    blurred: torch.Tensor,
    grid: torch.Tensor,
    mono_neg_substrate: str = "blur",
) -> dict[str, float]:
    """All faithfulness, extra and held-out substrate metrics of one map ``[H, W]`` on one image ``[C, H, W]``.

    ``mono_neg_substrate``: what negative monotonicity deletes into, ``blur`` (official) or ``black``.
    """
    h, w = sal.shape
    step = w  # one image row of pixels per step (the paper: 224 at 224 px)
    black = torch.zeros_like(img)
    mean = torch.full_like(img, float(img.mean()))
    neg_sub = blurred if check_mono_neg_substrate(mono_neg_substrate) == "blur" else black
    out: dict[str, float] = {}
    _, mas_i, _, _, norm_i = M.mas_single_run(fn, img, sal, "ins", blurred, step, target)
    _, mas_d, _, _, norm_d = M.mas_single_run(fn, img, sal, "del", black, step, target)
    raw_i = M.rise_curve(fn, img, sal, "ins", blurred, step, target)
    raw_d = M.rise_curve(fn, img, sal, "del", black, step, target)
    out["rise_ins"], out["rise_del"] = M.auc(norm_i), M.auc(norm_d)  # official: the normalised curve
    out["rise_insdel"] = out["rise_ins"] - out["rise_del"]
    out["rise_ins_raw"], out["rise_del_raw"] = M.auc(raw_i), M.auc(raw_d)
    out["rise_insdel_raw"] = out["rise_ins_raw"] - out["rise_del_raw"]
    out["mas_ins"], out["mas_del"] = M.auc(mas_i), M.auc(mas_d)
    out["mas_insdel"] = out["mas_ins"] - out["mas_del"]
    out["mono_pos"] = M.monotonicity(fn, img, sal, "positive", blurred, target, grid)[1]
    out["mono_neg"] = M.monotonicity(fn, img, sal, "negative", neg_sub, target, grid)[1]
    # the positive pixel-step curve is the raw RISE insertion curve on the same substrate: reuse it
    out["mono_pix_pos"] = M.ramp_spearman(raw_i, "positive")
    out["mono_pix_neg"] = M.pixel_monotonicity(fn, img, sal, "negative", neg_sub, step, target)[1]
    out["pert_pos"] = M.auc(M.perturbation_curve(fn, img, sal, "positive", target))
    out["pert_neg"] = M.auc(M.perturbation_curve(fn, img, sal, "negative", target))
    out["heldout_rise_ins"] = M.auc(M.rise_curve(fn, img, sal, "ins", mean, step, target))
    out["heldout_rise_del"] = M.auc(M.rise_curve(fn, img, sal, "del", mean, step, target))
    out["heldout_rise_insdel"] = out["heldout_rise_ins"] - out["heldout_rise_del"]
    return out


class MapMaker:
    """Computes one method's map; ``mda*`` names run MDA on the ``prior`` method's map.

    Args:
        model: a timm ViT in eval mode.
        mda_variants: name -> keyword overrides of :func:`ops.attribution.mda.mda` (``gamma`` picks the blend,
            ``smooth`` the smoothed map), e.g. ``{"mda": {}, "mda_tau0.5": {"cutoff": 0.5}}``.
        mda_kwargs: shared keyword arguments of :func:`~ops.attribution.mda.mda`.
    """

    def __init__(self, model: nn.Module, prior: str, patch_count: int, mda_variants: dict, mda_kwargs: dict) -> None:
        self.model, self.prior, self.patch_count = model, prior, patch_count
        self.variants, self.kwargs = mda_variants, mda_kwargs
        self.forwards: dict[str, list[int]] = defaultdict(list)

    def __call__(
        self,
        name: str,
        x: torch.Tensor,
        target: int,
        prior_map: torch.Tensor | None,
        blurred: tuple[torch.Tensor, int] | None = None,
    ) -> torch.Tensor:
        if name not in self.variants:
            return get_baseline(name)(self.model, x[None], target).double()
        opts = dict(self.kwargs)
        opts.update(self.variants[name] or {})
        gamma, smooth = float(opts.pop("gamma", 0.0)), bool(opts.pop("smooth", False))
        fn = model_probs(self.model)
        if blurred is not None and ("blur_klen" in self.variants[name] or "blur_max_conf" in self.variants[name]):
            blurred = None  # the variant calibrates its own substrate
        res = mda(fn, x, prior_map, self.patch_count, target=target, gammas=(gamma,), blurred=blurred, **opts)
        if res is None:
            raise ConfigError("blur calibration failed inside MDA although it passed for the image")
        self.forwards[name].append(res.forward_images)
        return (res.smooth if smooth else res.maps)[gamma].double()


def evaluate_attributions(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    methods: Sequence[str],
    mda_variants: dict,
    mda_kwargs: dict,
    patch: int,
    patch_count: int,
    prior: str = "bidirectional",
    min_confidence: float = 0.6,
    triggered: torch.Tensor | None = None,
    trigger_target: int | None = None,
    gt_mask: torch.Tensor | None = None,
    topk: int = 1,
    example_dir: str | Path | None = None,
    n_examples: int = 3,
    mono_neg_substrate: str = "blur",
) -> dict[str, float]:
    """Score every method on ``images`` ``[N, C, H, W]`` (and localisation on ``triggered`` ones).

    ``mono_neg_substrate``: the substrate negative monotonicity deletes into (``blur``, official; ``black``).

    Returns ``attr/<method>/<metric>`` means, ``attr/<method>/seconds`` per image, counts of the images used and
    skipped (``attr/n_images``, ``attr/skipped_wrong``, ``attr/skipped_lowconf``, ``attr/skipped_blur``) and MDA's
    forward passes per image (``attr/<variant>/forwards``). Writes ``mda_examples.png`` into ``example_dir``.
    """
    if not 0.0 <= min_confidence <= 1.0:
        raise ConfigError(f"min_confidence={min_confidence} must be in [0, 1]")
    check_mono_neg_substrate(mono_neg_substrate)
    model.eval()
    fn = model_probs(model)
    _, _, h, w = images.shape
    grid = patch_grid(h, w, patch)
    maker = MapMaker(model, prior, patch_count, mda_variants, mda_kwargs)
    blur_cfg = mda_kwargs.get("blur_klen", (31, 2, 101))
    blur_conf = mda_kwargs.get("blur_max_conf", 0.01)
    scores: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    seconds: dict[str, list[float]] = defaultdict(list)
    counts = {"n_images": 0, "skipped_wrong": 0, "skipped_lowconf": 0, "skipped_blur": 0}
    examples: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []

    def maps_for(x: torch.Tensor, target: int, cal: tuple[torch.Tensor, int]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        t0 = time.perf_counter()
        prior_map = get_baseline(prior)(model, x[None], target).double()
        prior_time = time.perf_counter() - t0
        for name in methods:
            t0 = time.perf_counter()
            out[name] = prior_map if name == prior else maker(name, x, target, prior_map, cal)
            extra = prior_time if (name in mda_variants or name == prior) else 0.0
            seconds[name].append(time.perf_counter() - t0 + extra)
            M.check_saliency(x, out[name])
        return out

    for x, y in zip(images, labels):
        p = fn(x[None])[0]
        target = int(p.argmax())
        if target != int(y):
            counts["skipped_wrong"] += 1
            continue
        if float(p[target]) < min_confidence:
            counts["skipped_lowconf"] += 1
            continue
        cal = calibrate_blur(fn, x, target, *blur_cfg, max_conf=blur_conf)
        if cal is None:
            counts["skipped_blur"] += 1
            continue
        counts["n_images"] += 1
        maps = maps_for(x, target, cal)
        for name, sal in maps.items():
            for k, v in score_map(fn, x, sal.to(x.dtype), target, cal[0], grid, mono_neg_substrate).items():
                scores[name][k].append(v)
        if len(examples) < n_examples:
            examples.append((x, maps))
    n_loc = 0
    if triggered is not None:
        if gt_mask is None or trigger_target is None:
            raise ConfigError("localisation needs gt_mask and trigger_target with triggered images")
        for x in triggered:
            p = fn(x[None])[0]
            if int(p.argmax()) != trigger_target or float(p[trigger_target]) < min_confidence:
                continue  # the backdoor did not fire: no ground truth for this image
            cal = calibrate_blur(fn, x, trigger_target, *blur_cfg, max_conf=blur_conf)
            if cal is None:
                counts["skipped_blur"] += 1  # MDA needs the blurred start image
                continue
            n_loc += 1
            maps = maps_for(x, trigger_target, cal)
            for name, sal in maps.items():
                scores[name]["pointing"].append(M.pointing_game(sal, gt_mask))
                scores[name]["iou_top1"].append(M.topk_patch_iou(sal, gt_mask, patch, 1))
                scores[name]["iou_topk"].append(M.topk_patch_iou(sal, gt_mask, patch, topk))
            if n_loc == 1 and len(examples) <= n_examples:
                examples.append((x, maps))
    out: dict[str, float] = {f"attr/{k}": float(v) for k, v in counts.items()}
    out["attr/n_localisation"] = float(n_loc)
    for name, per in scores.items():
        for k, vals in per.items():
            out[f"attr/{name}/{k}"] = float(np.mean(vals))
        out[f"attr/{name}/seconds"] = float(np.mean(seconds[name])) if seconds[name] else float("nan")
    for name, f in maker.forwards.items():
        out[f"attr/{name}/forwards"] = float(np.mean(f))
    if example_dir is not None and examples:
        plot_examples(examples, Path(example_dir) / "mda_examples.png")
    return out


def plot_examples(examples: list[tuple[torch.Tensor, dict[str, torch.Tensor]]], path: Path) -> Path:
    """A grid: one row per image (the image, then every method's map)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(examples[0][1])
    fig, axes = plt.subplots(len(examples), len(names) + 1, figsize=(1.6 * (len(names) + 1), 1.7 * len(examples)))
    axes = np.atleast_2d(axes)
    for r, (x, maps) in enumerate(examples):
        axes[r, 0].imshow(x[0].cpu().numpy(), cmap="gray")
        axes[r, 0].set_title("image" if r == 0 else "", fontsize=7)
        for c, name in enumerate(names, start=1):
            axes[r, c].imshow(maps[name].cpu().numpy(), cmap="jet")
            if r == 0:
                axes[r, c].set_title(name, fontsize=6)
    for ax in axes.ravel():
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
