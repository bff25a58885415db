"""TULIP (ICLR 2025): relative-position distillation and expansion of CLIP's text tower for long captions."""

from __future__ import annotations

from lightning_modules.tulip.module import TulipLitModule

__all__ = ["TulipLitModule"]
