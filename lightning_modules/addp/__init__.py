"""ADDP (Pang, Xu & Wang, ICLR 2025): conditional diffusion for depth and referring segmentation, its three insights."""

from lightning_modules.addp.module import AddpLitModule

__all__ = ["AddpLitModule"]
