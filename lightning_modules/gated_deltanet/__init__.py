"""Gated DeltaNet (Yang, Kautz & Hatamizadeh, ICLR 2025): the shared causal-LM system; the token mixer is the
``net`` config's (:class:`layers.lm.CausalLM`), the gated delta rule in ``ops/gated_delta_rule/``."""

from lightning_modules._shared.causal_lm import CausalLMLitModule

__all__ = ["CausalLMLitModule"]
