"""Stick-breaking attention (Tan et al., ICLR 2025): the shared causal-LM system with a stick-breaking mixer."""

from lightning_modules._shared.causal_lm import CausalLMLitModule

__all__ = ["CausalLMLitModule"]
