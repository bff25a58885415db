"""The attribution baselines of MDA's comparison (paper Sec. 4) on timm ``VisionTransformer`` models.

Every method has the signature ``fn(model, x [1, C, H, W], target) -> saliency [H, W]`` (float64, CPU); token-level
maps over the ``gh x gw`` patch grid are bilinearly upsampled to the image, as the reference implementations do.

From libraries (pinned in ``pyproject.toml``):

* ``integrated_gradients``: captum's ``IntegratedGradients`` (black baseline, 50 Gauss-Legendre steps),
  ``|sum_c IG_c|`` per pixel (Sundararajan et al., 2017);
* ``gradcam``: pytorch-grad-cam's ``GradCAM`` on the last block's ``norm1`` token features with a ViT reshape
  transform (CLS token dropped, tokens laid out on the patch grid).

Written here (no maintained library ships them for timm ViTs), each tested against its equation:

* ``gradcam_attn`` (Chefer et al. 2021's "GradCAM" baseline): ``ReLU(mean_h(mean(dy/dA_h) A_h[CLS, 1:]))`` on the
  last block's attention;
* ``rollout`` (Abnar & Zuidema, 2020): ``R = prod_l (0.5 mean_h A_l + 0.5 I)`` (rows renormalised), ``R[CLS, 1:]``;
* ``transformer_attribution`` (Chefer, Gur & Wolf, 2021a): ``prod_b (I + mean_h((dy/dA_b ⊙ R^(A_b))^+))`` from the
  LRP relevances ``R^(A_b)`` of the attention maps (:mod:`lightning_modules.mda.lrp`: captum's LRP has no rule for
  the attention products inside timm's blocks);
* ``transition_attention`` (TAM, Yuan et al., 2021): the Markov-chain state ``R[CLS, 1:]`` of the row-stochastic
  transitions ``0.5 A_l + 0.5 I`` (head mean) times the integrated gradient of the target w.r.t. the last
  attention's CLS row along ``alpha x``, ``alpha in (0, 1]`` (20 steps), clamped at 0;
* ``bidirectional`` (BT-token, Chen et al., 2023, MDA's prior): *attention perception* ``prod_l (I + mean_h(w_h
  A_h))`` with head weights ``w_h = ReLU(mean(dy/dA_h))``, times the *reasoning feedback*: the integrated gradient of
  the target w.r.t. the last block's input tokens, ``ReLU(sum_d IG)`` per token (20 steps);
* ``tis`` (Transformer Input Sampling, Englebienne et al., 2023): masks from k-means clusters of the blocks'
  activations (each centroid keeps its top ``tokens_ratio`` of the patch tokens); masked tokens are dropped from
  the sequence (not zeroed); ``S = sum_m p(m) m / sum_m m``, min-max normalised;
* ``vit_cx`` (Xie et al., 2023): the last block's ``norm1`` patch-token feature maps, upsampled to the image and
  min-max normalised, agglomeratively clustered (complete linkage, cosine distance threshold 0.1); each cluster's
  normalised sum is a mask ``M_k``, scored with the Gaussian noise step ``s_k = p(x ⊙ M_k + e_k ⊙ (1 - M_k)) -
  p(x + e_k ⊙ (1 - M_k)) + p(x)``; ``S = (1/K) sum_k s_k M_k / sum_j M_j`` (the density-corrected causal score).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from core.errors import ConfigError
from lightning_modules.mda.lrp import attention_relevance

Baseline = Callable[..., torch.Tensor]


def grid_size(model: nn.Module) -> tuple[int, int]:
    """The patch grid ``(gh, gw)`` of a timm ViT."""
    return tuple(int(g) for g in model.patch_embed.grid_size)


def num_prefix(model: nn.Module) -> int:
    """Tokens before the patch tokens (CLS and registers)."""
    return int(getattr(model, "num_prefix_tokens", 1))


def upsample(tokens: torch.Tensor, model: nn.Module, hw: tuple[int, int]) -> torch.Tensor:
    """Patch-token scores ``[gh * gw]`` -> ``[H, W]`` (bilinear)."""
    gh, gw = grid_size(model)
    m = tokens.reshape(1, 1, gh, gw).double()
    return F.interpolate(m, size=hw, mode="bilinear", align_corners=False)[0, 0].detach().cpu()


class AttentionRecorder:
    """Records every block's attention probabilities ``[B, heads, N, N]`` (and their gradients) of a timm ViT.

    Switches the blocks to the explicit (non-fused) attention path while active; hooks ``attn.attn_drop``, whose
    input and output is the softmax (dropout is off in eval).
    """

    def __init__(self, model: nn.Module) -> None:
        if not hasattr(model, "blocks"):
            raise ConfigError(f"{type(model).__name__} is not a timm VisionTransformer (no .blocks)")
        self.model, self.attn, self.handles, self.fused = model, [], [], []

    def _hook(self, _mod: nn.Module, _inp: tuple, out: torch.Tensor) -> None:
        if out.requires_grad:
            out.retain_grad()
        self.attn.append(out)

    def __enter__(self) -> AttentionRecorder:
        for blk in self.model.blocks:
            self.fused.append(blk.attn.fused_attn)
            blk.attn.fused_attn = False
            self.handles.append(blk.attn.attn_drop.register_forward_hook(self._hook))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()
        for blk, f in zip(self.model.blocks, self.fused):
            blk.attn.fused_attn = f


def _forward_with_attention(model: nn.Module, x: torch.Tensor, target: int, grad: bool):
    with AttentionRecorder(model) as rec, torch.set_grad_enabled(grad):
        logits = model(x)
        if grad:
            model.zero_grad(set_to_none=True)
            logits[0, target].backward()
    return logits, rec.attn


def rollout(model: nn.Module, x: torch.Tensor, target: int | None = None) -> torch.Tensor:
    """Attention rollout (Abnar & Zuidema, 2020), class-agnostic: ``R = prod_l norm(0.5 mean_h A_l + 0.5 I)``."""
    _, attn = _forward_with_attention(model, x, 0, grad=False)
    n = attn[0].shape[-1]
    r = torch.eye(n, dtype=torch.float64)
    for a in attn:
        t = 0.5 * a[0].mean(0).double() + 0.5 * torch.eye(n, dtype=torch.float64)
        r = (t / t.sum(-1, keepdim=True)) @ r
    return upsample(r[0, num_prefix(model) :], model, x.shape[-2:])


def gradcam_attn(model: nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    """Grad-CAM on the last attention map: ``ReLU(mean_h(mean(dy/dA_h) A_h[CLS, 1:]))`` (Chefer et al., 2021)."""
    _, attn = _forward_with_attention(model, x, target, grad=True)
    a, g = attn[-1][0].double(), attn[-1].grad[0].double()
    p = num_prefix(model)
    w = g[:, 0, p:].mean(-1, keepdim=True)  # one weight per head, the mean gradient of its CLS row
    return upsample((w * a[:, 0, p:]).mean(0).clamp_min(0), model, x.shape[-2:])


def transformer_attribution(model: nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    """Transformer Attribution (Chefer et al., 2021a, eqs. 8-9): ``C = prod_b (I + mean_h((dy/dA_b ⊙ R^(A_b))^+))``.

    ``R^(A_b)`` is the LRP relevance of block ``b``'s attention probabilities (:mod:`lightning_modules.mda.lrp`);
    the map is ``C[CLS, 1:]``.
    """
    _, attn, rel = attention_relevance(model, x, target)
    n = attn[0].shape[-1]
    r = torch.eye(n, dtype=torch.float64)
    for a, ra in zip(attn, rel):
        cam = (a.grad[0].double() * ra[0].double()).clamp_min(0).mean(0)
        r = r + cam @ r
    return upsample(r[0, num_prefix(model) :], model, x.shape[-2:])


def _ig_last_attention_cls(model: nn.Module, x: torch.Tensor, target: int, steps: int) -> torch.Tensor:
    p = num_prefix(model)
    total = None
    for alpha in torch.linspace(1.0 / steps, 1.0, steps):
        _, attn = _forward_with_attention(model, alpha * x, target, grad=True)
        g = attn[-1].grad[0].double().mean(0)[0, p:]
        total = g if total is None else total + g
    return total / steps


def transition_attention(model: nn.Module, x: torch.Tensor, target: int, steps: int = 20) -> torch.Tensor:
    """Transition attention maps (Yuan et al., 2021): Markov-chain state times integrated attention gradients."""
    _, attn = _forward_with_attention(model, x, target, grad=False)
    n = attn[0].shape[-1]
    r = torch.eye(n, dtype=torch.float64)
    for a in attn:
        r = (0.5 * a[0].double().mean(0) + 0.5 * torch.eye(n, dtype=torch.float64)) @ r
    state = r[0, num_prefix(model) :]
    ig = _ig_last_attention_cls(model, x, target, steps)
    return upsample((state * ig).clamp_min(0), model, x.shape[-2:])


def bidirectional(model: nn.Module, x: torch.Tensor, target: int, steps: int = 20) -> torch.Tensor:
    """BT-token (Chen et al., 2023): attention perception times integrated-gradient reasoning feedback."""
    _, attn = _forward_with_attention(model, x, target, grad=True)
    n = attn[0].shape[-1]
    r = torch.eye(n, dtype=torch.float64)
    for a in attn:
        w = a.grad[0].double().mean((-1, -2)).clamp_min(0)  # [heads]
        ah = (w[:, None, None] * a[0].double()).mean(0)
        r = r + ah @ r
    p = num_prefix(model)
    perception = r[0, p:]
    # reasoning feedback: IG of the target w.r.t. the last block's input tokens (straight path from 0)
    feats: dict[str, torch.Tensor] = {}

    def pre_hook(_m: nn.Module, args: tuple) -> tuple:
        t = args[0]
        t.retain_grad()
        feats["t"] = t
        return None

    h = model.blocks[-1].register_forward_pre_hook(pre_hook)
    try:
        total = torch.zeros(n, dtype=torch.float64)
        for alpha in torch.linspace(1.0 / steps, 1.0, steps):
            model.zero_grad(set_to_none=True)
            xi = (alpha * x).detach().requires_grad_(True)
            model(xi)[0, target].backward()
            t = feats["t"]
            total += (t.grad[0] * t[0]).sum(-1).double().detach()
    finally:
        h.remove()
    feedback = (total / steps)[p:].clamp_min(0)
    return upsample(perception * feedback, model, x.shape[-2:])


def forward_tokens(model: nn.Module, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Logits of a timm ViT run on a subset of patch tokens: ``keep`` ``[M, gh * gw]`` booleans -> ``[M, K]``.

    Tokens are embedded and position-encoded, the dropped ones removed from the sequence (TIS); every mask of a call
    must keep the same number of tokens.
    """
    t = model._pos_embed(model.patch_embed(x))  # [1, prefix + N, D]
    p = num_prefix(model)
    counts = keep.sum(1)
    if not bool((counts == counts[0]).all()):
        raise ConfigError("forward_tokens: all masks of a batch must keep the same number of tokens")
    idx = torch.nonzero(keep)[:, 1].reshape(len(keep), -1)
    patches = t[0, p:][idx]  # [M, k, D]
    seq = torch.cat([t[:, :p].expand(len(keep), -1, -1), patches], 1)
    seq = model.norm_pre(seq)
    seq = model.blocks(seq)
    seq = model.norm(seq)
    return model.forward_head(seq)


def block_activations(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Every block's output tokens concatenated along the features: ``[N_tokens, D * L]`` (one image)."""
    acts: list[torch.Tensor] = []
    hs = [blk.register_forward_hook(lambda _m, _i, out: acts.append(out.detach())) for blk in model.blocks]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hs:
            h.remove()
    return torch.cat(acts, -1)[0]


def tis_masks(
    model: nn.Module, x: torch.Tensor, n_masks: int = 1024, tokens_ratio: float | tuple[float, ...] = 0.5, seed: int = 0
) -> torch.Tensor:
    """TIS's token masks ``[M, gh * gw]`` (booleans): k-means (``n_masks`` clusters, scikit-learn) of the activation
    vectors of every block, each a point over the patch tokens; each centroid keeps its ``tokens_ratio * N``
    highest tokens (one mask per centroid and ratio). ``n_masks`` is capped by the number of distinct points."""
    from sklearn.cluster import KMeans

    pts = block_activations(model, x)[num_prefix(model) :].T.double().cpu().numpy()  # [D * L, N]
    n = pts.shape[1]
    k = max(1, min(int(n_masks), len(np.unique(pts, axis=0))))
    centroids = torch.from_numpy(KMeans(n_clusters=k, n_init=1, random_state=seed).fit(pts).cluster_centers_)
    ratios = (tokens_ratio,) if isinstance(tokens_ratio, float | int) else tuple(tokens_ratio)
    masks = []
    for c in centroids:
        for ratio in ratios:
            keep = torch.zeros(n, dtype=torch.bool)
            keep[torch.topk(c, max(1, int(ratio * n))).indices] = True
            masks.append(keep)
    return torch.stack(masks)


@torch.no_grad()
def tis(
    model: nn.Module,
    x: torch.Tensor,
    target: int,
    n_masks: int = 1024,
    tokens_ratio: float | tuple[float, ...] = 0.5,
    seed: int = 0,
    batch_size: int = 64,
) -> torch.Tensor:
    """Transformer Input Sampling (Englebienne et al., 2023): ``S = sum_m p(m) m / sum_m m`` over the clustered token
    masks of :func:`tis_masks`, ``p(m)`` the target probability with only the kept tokens in the sequence; min-max
    normalised to ``[0, 1]`` (tokens no mask keeps score 0)."""
    keep = tis_masks(model, x, n_masks, tokens_ratio, seed)
    counts = keep.sum(1)
    p = torch.zeros(len(keep), dtype=torch.float64)
    for cnt in counts.unique():  # forward_tokens needs equal-length sequences (one group per ratio)
        idx = torch.nonzero(counts == cnt)[:, 0]
        for i in range(0, len(idx), batch_size):
            j = idx[i : i + batch_size]
            p[j] = torch.softmax(forward_tokens(model, x, keep[j]), 1)[:, target].double().cpu()
    m = keep.double()
    s = (p[:, None] * m).sum(0) / m.sum(0).clamp_min(1)
    s = s - s.min()
    s = s / s.max() if float(s.max()) > 0 else s
    return upsample(s, model, x.shape[-2:])


def vit_cx_masks(model: nn.Module, x: torch.Tensor, distance_threshold: float = 0.1) -> torch.Tensor:
    """ViT-CX's masks ``[K, H, W]``: the last block's ``norm1`` patch-token features as ``D`` maps, upsampled to the
    image and min-max normalised, agglomeratively clustered (complete linkage on cosine distance ``1 - cos``, merged
    below ``distance_threshold``, scikit-learn); each cluster's summed maps, min-max normalised, is a mask."""
    from sklearn.cluster import AgglomerativeClustering

    feats: dict[str, torch.Tensor] = {}
    h = model.blocks[-1].norm1.register_forward_hook(lambda _m, _i, out: feats.__setitem__("f", out.detach()))
    try:
        with torch.no_grad():
            model(x)
    finally:
        h.remove()
    gh, gw = grid_size(model)
    hw = x.shape[-2:]
    f = feats["f"][0, num_prefix(model) :].double().T.reshape(-1, 1, gh, gw)  # [D, 1, gh, gw]
    maps = F.interpolate(f, size=hw, mode="bilinear", align_corners=False).reshape(len(f), -1)
    maps = _minmax_rows(maps)
    norm = maps.norm(dim=1, keepdim=True)
    sim = torch.nan_to_num((maps @ maps.T) / (norm * norm.T), nan=0.0)
    dist = (1 - sim).clamp_min(0).cpu().numpy()
    if len(maps) > 1:
        labels = AgglomerativeClustering(
            n_clusters=None, distance_threshold=distance_threshold, metric="precomputed", linkage="complete"
        ).fit_predict(dist)
    else:
        labels = np.zeros(1, dtype=int)
    k = int(labels.max()) + 1
    summed = torch.zeros(k, maps.shape[1], dtype=torch.float64).index_add_(0, torch.from_numpy(labels), maps)
    return _minmax_rows(summed).reshape(k, *hw)


def _minmax_rows(m: torch.Tensor) -> torch.Tensor:
    lo, hi = m.amin(1, keepdim=True), m.amax(1, keepdim=True)
    return (m - lo) / (hi - lo).clamp_min(1e-12)


@torch.no_grad()
def causal_score(
    model: nn.Module,
    x: torch.Tensor,
    masks: torch.Tensor,
    target: int,
    noise_std: float = 0.1,
    seed: int = 0,
    batch_size: int = 64,
) -> torch.Tensor:
    """ViT-CX's causal impact score with its noise step and density correction ``[H, W]``.

    With Gaussian noise ``e_k ~ N(0, noise_std^2)`` put where mask ``M_k`` removes the image,
    ``s_k = p(x ⊙ M_k + e_k ⊙ (1 - M_k)) - p(x + e_k ⊙ (1 - M_k)) + p(x)`` (the noise's own effect cancelled), and
    ``S = (1 / K) sum_k s_k M_k / sum_j M_j``.
    """
    dtype = next(model.parameters()).dtype
    xd = x[0].double()
    m = masks.double().to(xd.device)[:, None]  # [K, 1, H, W]
    g = torch.Generator().manual_seed(seed)
    noise = (torch.randn(len(m), *xd.shape, generator=g, dtype=torch.float64) * noise_std).to(xd.device) * (1 - m)
    stack = torch.cat([xd * m + noise, xd + noise])
    probs = torch.cat(
        [
            torch.softmax(model(stack[i : i + batch_size].to(dtype)), 1)[:, target]
            for i in range(0, len(stack), batch_size)
        ]
    ).double()
    p_x = float(torch.softmax(model(x.to(dtype)), 1)[0, target])
    k = len(m)
    s = probs[:k] - probs[k:] + p_x
    dens = m[:, 0] / m[:, 0].sum(0).clamp_min(1e-12)
    return ((s[:, None, None] * dens).sum(0) / k).cpu()


def vit_cx(
    model: nn.Module,
    x: torch.Tensor,
    target: int,
    distance_threshold: float = 0.1,
    noise_std: float = 0.1,
    seed: int = 0,
) -> torch.Tensor:
    """ViT-CX (Xie et al., 2023): :func:`causal_score` of the clustered feature masks of :func:`vit_cx_masks`."""
    return causal_score(model, x, vit_cx_masks(model, x, distance_threshold), target, noise_std, seed)


def integrated_gradients(model: nn.Module, x: torch.Tensor, target: int, n_steps: int = 50) -> torch.Tensor:
    """captum Integrated Gradients from a black baseline, ``|sum_c IG_c|``."""
    from captum.attr import IntegratedGradients

    ig = IntegratedGradients(lambda inp: torch.softmax(model(inp), 1))
    attr = ig.attribute(x, baselines=torch.zeros_like(x), target=target, n_steps=n_steps)
    return attr[0].sum(0).abs().double().detach().cpu()


def gradcam(model: nn.Module, x: torch.Tensor, target: int) -> torch.Tensor:
    """pytorch-grad-cam's Grad-CAM on the last block's ``norm1`` tokens (ViT reshape transform)."""
    from pytorch_grad_cam import GradCAM
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    gh, gw = grid_size(model)
    p = num_prefix(model)

    def reshape(t: torch.Tensor) -> torch.Tensor:
        return t[:, p:, :].reshape(t.size(0), gh, gw, t.size(2)).permute(0, 3, 1, 2)

    with GradCAM(model=model, target_layers=[model.blocks[-1].norm1], reshape_transform=reshape) as cam:
        out = cam(input_tensor=x, targets=[ClassifierOutputTarget(target)])
    return torch.from_numpy(np.asarray(out[0], dtype=np.float64))


BASELINES: dict[str, Baseline] = {
    "gradcam_attn": gradcam_attn,
    "integrated_gradients": integrated_gradients,
    "transformer_attribution": transformer_attribution,
    "transition_attention": transition_attention,
    "bidirectional": bidirectional,
    "tis": tis,
    "vit_cx": vit_cx,
}
EXTRAS: dict[str, Baseline] = {"rollout": rollout, "gradcam": gradcam}


def get_baseline(name: str) -> Baseline:
    """A baseline by name (the seven of the paper plus ``rollout`` and library ``gradcam``)."""
    table = {**BASELINES, **EXTRAS}
    if name not in table:
        raise ConfigError(f"unknown attribution method {name!r}; known: {sorted(table)} and 'mda'")
    return table[name]
