"""SuMi (Guo & Jin, ICLR 2025): the audio-visual source model that the test-time adaptation callbacks adapt."""

from lightning_modules.sumi.module import SumiLitModule

__all__ = ["SumiLitModule"]
