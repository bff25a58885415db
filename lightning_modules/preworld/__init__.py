"""PreWorld (ICLR 2025): semi-supervised vision-centric 3D occupancy world model, with its baselines."""

from lightning_modules.preworld.module import LossWeights, PreWorldLitModule

__all__ = ["LossWeights", "PreWorldLitModule"]
