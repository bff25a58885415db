"""ADDP's pure functions (Pang, Xu & Wang, ICLR 2025): contribution-aware timesteps, drift-simulating augmentation,
correctional guidance. See :mod:`ops.addp.timesteps`, :mod:`ops.addp.augment`, :mod:`ops.addp.guidance`."""

from __future__ import annotations

from ops.addp.augment import AUGMENTS, mix_self, tailored_augment
from ops.addp.guidance import correctional_cfg
from ops.addp.timesteps import (
    contribution_curve,
    ddim_timesteps,
    loss_weight,
    power_distribution,
    sample_timesteps,
    vp_sigma_tilde,
)

__all__ = [
    "AUGMENTS",
    "contribution_curve",
    "correctional_cfg",
    "ddim_timesteps",
    "loss_weight",
    "mix_self",
    "power_distribution",
    "sample_timesteps",
    "tailored_augment",
    "vp_sigma_tilde",
]
