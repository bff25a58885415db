"""Diffusion-tailored data augmentation (ADDP insight 2): simulate the training-denoising drift.

At inference the input of DDIM step k is built from the model's own previous x0-prediction, ``x~_k = x0^_{k-1} +
sigma~_k eps^``, while training noises the ground truth, ``x~ = x0 + sigma~ n``. **Our interpretation** (the recipe
was not recovered): noise a *perturbed* target ``x0_aug`` and keep the clean ``x0`` as the regression target, so the
denoiser learns to correct intermediate mistakes. Perturbations (targets in the model's [-1, 1] space, [B, 1, H, W]):

* ``self``: the model's own detached x0-prediction at a noisier timestep (:func:`mix_self`; built in the module).
* ``morph`` (masks): dilation or erosion by a (2r+1)^2 square, r = 1..ceil(2 strength).
* ``shift`` (masks and depth): a translation by up to ceil(2 strength) pixels per axis (edge-replicated).
* ``warp`` (depth): an affine depth error ``a x0 + b`` and a smooth low-frequency field (a 4x4 grid upsampled),
  amplitudes proportional to ``strength``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import functional as F

from core.errors import ConfigError

AUGMENTS = ("none", "self", "morph", "shift", "warp")


def mix_self(x0: Tensor, x0_hat: Tensor, strength: float) -> Tensor:
    """``x0 + strength (x0_hat - x0)``: 1 replaces the target by the model's prediction, 0 keeps it."""
    return x0 + strength * (x0_hat.detach() - x0)


def _shift(x: Tensor, r: int, g: torch.Generator | None) -> Tensor:
    b = x.shape[0]
    d = torch.randint(-r, r + 1, (b, 2), generator=g)
    pad = F.pad(x, (r, r, r, r), mode="replicate")
    h, w = x.shape[-2:]
    return torch.stack([pad[i, :, r + dy : r + dy + h, r + dx : r + dx + w] for i, (dy, dx) in enumerate(d.tolist())])


def tailored_augment(x0: Tensor, kind: str, strength: float, generator: torch.Generator | None = None) -> Tensor:
    """Perturb targets ``x0 [B, 1, H, W]`` in [-1, 1] by ``kind`` (see the module docstring) at ``strength >= 0``.

    ``self`` needs the model and is done by :func:`mix_self`; ``none`` or strength 0 return ``x0``.
    """
    if kind not in AUGMENTS:
        raise ConfigError(f"augmentation kind={kind!r} must be one of {list(AUGMENTS)}")
    if strength < 0:
        raise ConfigError(f"augmentation strength={strength} must be >= 0")
    if kind == "self":
        raise ConfigError("kind='self' needs the model's prediction: use mix_self")
    if kind == "none" or strength == 0:
        return x0
    r = max(1, math.ceil(2 * strength))
    if kind == "shift":
        return _shift(x0, r, generator)
    if kind == "morph":
        radii = torch.randint(1, r + 1, (x0.shape[0],), generator=generator)
        dilate = torch.rand(x0.shape[0], generator=generator) < 0.5
        out = []
        for i in range(x0.shape[0]):
            k = 2 * int(radii[i]) + 1
            xi = x0[i : i + 1]
            m = F.max_pool2d(xi, k, 1, k // 2) if dilate[i] else -F.max_pool2d(-xi, k, 1, k // 2)
            out.append(m)
        return torch.cat(out)
    b = x0.shape[0]
    a = 1 + 0.2 * strength * torch.randn(b, 1, 1, 1, generator=generator, dtype=x0.dtype)
    c = 0.2 * strength * torch.randn(b, 1, 1, 1, generator=generator, dtype=x0.dtype)
    field = 0.2 * strength * torch.randn(b, 1, 4, 4, generator=generator, dtype=x0.dtype)
    field = F.interpolate(field, size=x0.shape[-2:], mode="bilinear", align_corners=False)
    return a * x0 + c + field
