"""Training systems that several papers share; each paper's folder re-exports the one it uses.

* :mod:`.causal_lm` (``CausalLMLitModule``): ``gated_deltanet``, ``stickbreaking``, ``systematic_outliers``,
  ``ostquant``.
* :mod:`.diffusion` (``DiffusionLitModule``): ``rx_dpm``, ``sgm_lipschitz``.
"""
