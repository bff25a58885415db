"""Vision-language dual encoders: CLIP on open_clip's classes, TULIP's RoPE text tower, Long-CLIP stretching."""

from __future__ import annotations

from layers.vision_language.clip import DualEncoder, build_open_clip, clip_loss, distill_loss, pca_features
from layers.vision_language.text_towers import AbsoluteTextTower, RoPETextTower, causal_mask, stretch_positions

__all__ = [
    "AbsoluteTextTower",
    "DualEncoder",
    "RoPETextTower",
    "build_open_clip",
    "causal_mask",
    "clip_loss",
    "distill_loss",
    "pca_features",
    "stretch_positions",
]
