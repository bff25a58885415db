"""Systematic outliers in LLMs (ICLR 2025): the shared causal-LM system with the outlier attention variants."""

from lightning_modules._shared.causal_lm import CausalLMLitModule

__all__ = ["CausalLMLitModule"]
