"""SEMDICE (ICLR 2025): tabular module and baselines (:mod:`.tabular`), deep pre-training (:mod:`.deep`), downstream
fine-tuning (:mod:`.finetune`)."""

from lightning_modules.semdice.deep import DeepSemdiceLitModule
from lightning_modules.semdice.finetune import DdpgFinetuneLitModule
from lightning_modules.semdice.tabular import SemdiceLitModule

__all__ = ["DdpgFinetuneLitModule", "DeepSemdiceLitModule", "SemdiceLitModule"]
