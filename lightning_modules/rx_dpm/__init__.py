"""RX-DPM (Choi, Kang & Han, ICLR 2025): the shared diffusion system, sampled with and without extrapolation."""

from lightning_modules._shared.diffusion import DiffusionLitModule

__all__ = ["DiffusionLitModule"]
