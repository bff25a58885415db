"""Denoiser networks for diffusion models (rx_dpm, sgm_lipschitz): EDM preconditioning, MLP, small U-Net."""

from __future__ import annotations

from layers.diffusion.nets import MLPDenoiser, SmallUNet
from layers.diffusion.precond import EDMPrecond

__all__ = ["EDMPrecond", "MLPDenoiser", "SmallUNet"]
