"""SEMDICE (ICLR 2025): tabular LightningModule and baselines (:mod:`.tabular`), deep pre-training (:mod:`.deep`)."""

from lightning_modules.semdice.deep import DeepSemdiceLitModule
from lightning_modules.semdice.tabular import SemdiceLitModule

__all__ = ["DeepSemdiceLitModule", "SemdiceLitModule"]
