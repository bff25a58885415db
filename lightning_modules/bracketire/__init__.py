"""BracketIRE (ICLR 2025): TMRNet, its baselines, supervised training and self-supervised adaptation."""

from lightning_modules.bracketire.module import BracketIRELitModule

__all__ = ["BracketIRELitModule"]
