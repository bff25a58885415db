"""GRASS (ICLR 2025): graph attention with stochastic structures, with its GINE and GraphGPS baselines."""

from lightning_modules.grass.module import GrassLitModule, RewiringMAE, build_net

__all__ = ["GrassLitModule", "RewiringMAE", "build_net"]
