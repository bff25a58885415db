"""CLIP dual encoder on open_clip's model classes (``pretrained=None``: never a download).

:func:`build_open_clip` makes an open_clip ``CLIP`` from explicit sizes (the tiny CPU towers) or from a model name
(``ViT-B-16``) with an optional *local* checkpoint file, which open_clip loads with its own key names (an
OpenCLIP state dict, or an OpenAI checkpoint converted by open_clip). :class:`DualEncoder` then takes its vision
tower and one of the two text towers of :mod:`layers.vision_language.text_towers`, so TULIP runs unchanged on a
real ViT-B/16 checkpoint.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from core.errors import CheckpointError, check
from layers.vision_language.text_towers import AbsoluteTextTower, RoPETextTower


def build_open_clip(
    model_name: str | None = None,
    checkpoint: str | None = None,
    embed_dim: int = 64,
    image_size: int = 64,
    patch_size: int = 8,
    vision_width: int = 64,
    vision_layers: int = 2,
    vision_head_width: int = 32,
    context_length: int = 32,
    vocab_size: int = 49408,
    text_width: int = 64,
    text_heads: int = 2,
    text_layers: int = 2,
    quick_gelu: bool = False,
) -> nn.Module:
    """An open_clip ``CLIP``: the named architecture (``model_name``, e.g. ``ViT-B-16``) or a custom one.

    Args:
        model_name: open_clip architecture name; ``None`` builds the custom sizes below.
        checkpoint: Local checkpoint file loaded by ``open_clip.load_checkpoint`` (only with ``model_name``).
        embed_dim: Joint embedding size.
        image_size: Input side in pixels.
        patch_size: ViT patch side.
        vision_width: ViT width.
        vision_layers: ViT blocks.
        vision_head_width: ViT head size (heads = width / head_width).
        context_length: Text context ``L`` (absolute positions).
        vocab_size: BPE vocabulary (49408).
        text_width: Text width.
        text_heads: Text heads.
        text_layers: Text blocks.
        quick_gelu: ``x * sigmoid(1.702 x)`` activations (open_clip ``force_quick_gelu``), which OpenAI's CLIP weights
            were trained with; ``ViT-B-16`` alone is the GELU architecture of OpenCLIP's own checkpoints, so a
            checkpoint of OpenAI weights needs ``quick_gelu=true`` (or ``model_name=ViT-B-16-quickgelu``).
    """
    import open_clip
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    if model_name is not None:
        try:
            model = open_clip.create_model(
                model_name, pretrained=None, device=torch.get_default_device(), force_quick_gelu=quick_gelu
            )
        except RuntimeError as err:
            raise CheckpointError(f"model.net.model_name={model_name!r}: {err}") from None
        if checkpoint is not None and torch.get_default_device().type != "meta":  # meta: counting parameters only
            if not Path(checkpoint).is_file():
                raise CheckpointError(f"CLIP checkpoint file {checkpoint} does not exist")
            try:
                open_clip.load_checkpoint(model, checkpoint)
            except Exception as err:  # noqa: BLE001 - a bad file becomes one line naming it
                raise CheckpointError(f"cannot load CLIP checkpoint {checkpoint} into {model_name}: {err}") from None
        return model
    check(checkpoint is None, "model.net.checkpoint needs model.net.model_name (an open_clip architecture)")
    check(image_size % patch_size == 0, f"image_size={image_size} must divide by patch_size={patch_size}")
    vision = CLIPVisionCfg(
        layers=vision_layers,
        width=vision_width,
        head_width=vision_head_width,
        patch_size=patch_size,
        image_size=image_size,
    )
    text = CLIPTextCfg(
        context_length=context_length, vocab_size=vocab_size, width=text_width, heads=text_heads, layers=text_layers
    )
    return CLIP(embed_dim, vision, text, quick_gelu=quick_gelu)


class DualEncoder(nn.Module):
    """Image tower + text tower + learned temperature (CLIP, Radford et al., 2021).

    ``logits = exp(logit_scale) * norm(f_I) norm(f_T)^T``. The forward does not clamp the temperature, so it keeps its
    gradient at the cap; the trainer clamps the *parameter* to ``[0, log 100]`` after each optimiser step
    (:meth:`clamp_logit_scale`), as CLIP and the official TULIP training loop do.

    Args:
        visual: Image encoder ``[B, 3, H, W] -> [B, E]`` (open_clip ``VisionTransformer``).
        text: :class:`AbsoluteTextTower` or :class:`RoPETextTower`.
        logit_scale: Initial ``log(1 / temperature)`` (``log(1/0.07)``).
    """

    def __init__(self, visual: nn.Module, text: nn.Module, logit_scale: float = float(np.log(1 / 0.07))) -> None:
        super().__init__()
        self.visual, self.text = visual, text
        self.logit_scale = nn.Parameter(torch.tensor(float(logit_scale)))

    @classmethod
    def from_open_clip(cls, clip: nn.Module) -> DualEncoder:
        """An open_clip ``CLIP`` as a dual encoder with its absolute text tower (modules shared)."""
        enc = cls(clip.visual, AbsoluteTextTower.from_open_clip(clip))
        enc.logit_scale = clip.logit_scale
        return enc

    def with_text(self, text: nn.Module) -> DualEncoder:
        """A dual encoder sharing this one's vision tower and temperature, with another text tower."""
        enc = DualEncoder(self.visual, text)
        enc.logit_scale = self.logit_scale
        return enc

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """Normalised image features ``[B, E]``."""
        return F.normalize(self.visual(images), dim=-1)

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        """Normalised text features ``[B, E]`` of token ids ``[B, T]``."""
        return F.normalize(self.text(tokens), dim=-1)

    def scale(self) -> torch.Tensor:
        """``exp(logit_scale)``, unclamped (see :meth:`clamp_logit_scale`)."""
        return self.logit_scale.exp()

    @torch.no_grad()
    def clamp_logit_scale(self, max_scale: float = 100.0) -> None:
        """Clamp the parameter to ``[0, log(max_scale)]`` in place; call it after the optimiser step."""
        self.logit_scale.clamp_(0.0, math.log(max_scale))


def clip_loss(image_features: torch.Tensor, text_features: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Symmetric InfoNCE of CLIP: ``(CE(s I T^T, diag) + CE(s T I^T, diag)) / 2`` on normalised ``[B, E]`` features."""
    logits = scale * image_features @ text_features.T
    labels = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def pca_features(features: torch.Tensor, dim: int) -> torch.Tensor:
    """Long-CLIP's principal-component filter (Zhang et al., 2024, Sec. 3.2; official ``CLIP.PCA``): features
    ``[B, E]`` centred over the batch, projected onto their top ``dim`` principal components (SVD) and mapped back,
    mean added: ``[B, E]``, not renormalised. The image side of Long-CLIP's short-caption loss, which matches these
    coarse image features with the short captions' text features.

    The basis is taken without gradient (the features still get theirs through the projection); the official
    backpropagates through the SVD, which its training script notes can give infinities.
    """
    check(dim >= 1, f"PCA dim={dim} must be >= 1")
    mean = features.mean(0, keepdim=True)
    centred = features - mean
    work = centred.detach()
    if work.dtype in (torch.float16, torch.bfloat16):  # SVD in float32 (the official casts too)
        work = work.float()
    _, _, vh = torch.linalg.svd(work, full_matrices=False)  # vh [min(B, E), E]
    basis = vh[:dim].T.to(features.dtype)  # [E, dim]
    return centred @ basis @ basis.T + mean


def distill_loss(teacher: torch.Tensor, student: torch.Tensor, kind: str = "cosine") -> torch.Tensor:
    """Relative-position distillation loss (TULIP Sec. 3.2, Eq. 4) between text features ``[B, E]``.

    ``cosine``: ``1 - mean_b cos(f_T, f_S)`` (the paper's); ``mse``: mean squared error; ``l2``: mean over the batch
    of ``||f_T - f_S||_2`` (the official code's alternatives).
    """
    if kind == "cosine":
        return 1 - F.cosine_similarity(teacher, student, dim=-1).mean()
    if kind == "mse":
        return F.mse_loss(student, teacher)
    if kind == "l2":
        return (student - teacher).norm(dim=-1).mean()
    raise ValueError(f"distill loss {kind!r} must be cosine, mse or l2")


__all__ = ["DualEncoder", "RoPETextTower", "build_open_clip", "clip_loss", "distill_loss", "pca_features"]
