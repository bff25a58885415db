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
* ``transformer_attribution``: Chefer et al.'s gradient-weighted attention rule ``R <- R + mean_h((dy/dA ⊙ A)^+) R``
  from ``R = I`` (their 2021b generic rule; the 2021a version also weights by LRP relevances, which need a
  relevance-propagating copy of every layer and are not reimplemented: a documented simplification);
* ``transition_attention`` (TAM, Yuan et al., 2021): the Markov-chain state ``R[CLS, 1:]`` of the row-stochastic
  transitions ``0.5 A_l + 0.5 I`` (head mean) times the integrated gradient of the target w.r.t. the last
  attention's CLS row along ``alpha x``, ``alpha in (0, 1]`` (20 steps), clamped at 0;
* ``bidirectional`` (BT-token, Chen et al., 2023, MDA's prior): *attention perception* ``prod_l (I + mean_h(w_h
  A_h))`` with head weights ``w_h = ReLU(mean(dy/dA_h))``, times the *reasoning feedback*: the integrated gradient of
  the target w.r.t. the last block's input tokens, ``ReLU(sum_d IG)`` per token (20 steps);
* ``tis`` (Transformer Input Sampling, Englebienne et al., 2023): RISE over *token subsets*: masked tokens are
  dropped from the sequence (not zeroed); ``S = sum_m p(m) m / sum_m m`` over ``n_masks`` Bernoulli(0.5) masks;
* ``vit_cx`` (Xie et al., 2023): last-block patch-token feature maps, upsampled to the image and min-max
  normalised, agglomeratively clustered (``n_clusters``); each cluster mean is a mask ``M_k``, scored by
  ``s_k = p(x ⊙ M_k)``; ``S = sum_k s_k M_k / sum_k M_k`` (the density-corrected causal score, without the
  official noise term).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from suite.errors import ConfigError

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
    """Chefer et al.'s gradient-weighted attention rule: ``R <- R + mean_h((dy/dA ⊙ A)^+) R`` from ``R = I``."""
    _, attn = _forward_with_attention(model, x, target, grad=True)
    n = attn[0].shape[-1]
    r = torch.eye(n, dtype=torch.float64)
    for a in attn:
        cam = (a.grad[0].double() * a[0].double()).clamp_min(0).mean(0)
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


@torch.no_grad()
def tis(model: nn.Module, x: torch.Tensor, target: int, n_masks: int = 256, seed: int = 0) -> torch.Tensor:
    """Transformer Input Sampling: ``S = sum_m p(m) m / sum_m m`` over random half-size token subsets."""
    gh, gw = grid_size(model)
    n = gh * gw
    g = torch.Generator().manual_seed(seed)
    keep = torch.zeros(n_masks, n, dtype=torch.bool)
    k = max(1, n // 2)
    for i in range(n_masks):
        keep[i, torch.randperm(n, generator=g)[:k]] = True
    probs = torch.cat(
        [torch.softmax(forward_tokens(model, x, keep[i : i + 64]), 1)[:, target] for i in range(0, n_masks, 64)]
    )
    m = keep.double()
    s = (probs.double()[:, None] * m).sum(0) / m.sum(0).clamp_min(1)
    return upsample(s, model, x.shape[-2:])


@torch.no_grad()
def vit_cx(model: nn.Module, x: torch.Tensor, target: int, n_clusters: int = 16) -> torch.Tensor:
    """ViT-CX: clustered patch-embedding masks scored by the target probability of the masked image."""
    from sklearn.cluster import AgglomerativeClustering

    feats: dict[str, torch.Tensor] = {}
    h = model.blocks[-1].register_forward_hook(lambda _m, _i, out: feats.__setitem__("f", out))
    try:
        model(x)
    finally:
        h.remove()
    gh, gw = grid_size(model)
    f = feats["f"][0, num_prefix(model) :].double().T.reshape(-1, 1, gh, gw)  # [D, 1, gh, gw]
    maps = F.interpolate(f, size=x.shape[-2:], mode="bilinear", align_corners=False)[:, 0]
    lo = maps.amin((1, 2), keepdim=True)
    hi = maps.amax((1, 2), keepdim=True)
    maps = (maps - lo) / (hi - lo).clamp_min(1e-12)
    flat = maps.reshape(len(maps), -1).numpy()
    k = min(n_clusters, len(flat))
    labels = AgglomerativeClustering(n_clusters=k).fit_predict(flat) if k > 1 else np.zeros(len(flat), dtype=int)
    masks = torch.stack([maps[torch.from_numpy(labels == c)].mean(0) for c in range(k)])  # [k, H, W]
    scores = torch.softmax(model((x.double() * masks[:, None]).to(x.dtype)), 1)[:, target].double()
    return ((scores[:, None, None] * masks).sum(0) / masks.sum(0).clamp_min(1e-12)).cpu()


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
