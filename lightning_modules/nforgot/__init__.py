"""N-ForGOT (ICLR 2025): open-set class-incremental learning on temporal graphs, with its baselines."""

from lightning_modules.nforgot.module import NForGOTLitModule

__all__ = ["NForGOTLitModule"]
