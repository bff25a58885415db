"""Lightning-free multimodal networks."""

from __future__ import annotations

from layers.multimodal.av_transformer import AudioVisualTransformer, FusionBlock

__all__ = ["AudioVisualTransformer", "FusionBlock"]
