"""MDA (Walker, Jha & Ewetz, ICLR 2025): subject ViT, attribution baselines and the attribution benchmark."""

from lightning_modules.mda.module import MdaLitModule

__all__ = ["MdaLitModule"]
