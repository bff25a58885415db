"""OSTQuant (ICLR 2025): the subjects it quantizes (the quantization itself is ``callbacks.quant_calibration``).

``CausalLMLitModule``: the suite's shared causal LM; ``MiniLMMLMLitModule``: an MLM head fitted on the frozen
MiniLM encoder (:mod:`.minilm_mlm`).
"""

from lightning_modules._shared.causal_lm import CausalLMLitModule
from lightning_modules.ostquant.minilm_mlm import MiniLMMLMLitModule

__all__ = ["CausalLMLitModule", "MiniLMMLMLitModule"]
