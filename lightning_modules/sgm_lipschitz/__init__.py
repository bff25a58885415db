"""Sharp Lipschitz estimates of the score (Mooney et al., ICLR 2025): the shared diffusion system, which logs the
learned and the exact score's Lipschitz constant over noise levels."""

from lightning_modules._shared.diffusion import DiffusionLitModule

__all__ = ["DiffusionLitModule"]
