"""SEMDICE (ICLR 2025): tabular LightningModule and baselines (:mod:`.tabular`)."""

from lightning_modules.semdice.tabular import SemdiceLitModule

__all__ = ["SemdiceLitModule"]
