"""LiCE: likely counterfactual explanations by mixed-integer optimisation over a sum-product network (ICLR 2025).

``spn`` (LearnSPN, exact LL and max-approximation), ``mio`` (the Pyomo MIO solved by HiGHS), ``dice`` (the
DiCE-style baseline), ``module`` (``LiceLitModule``); the claim-check hook is ``reports/lice.py``.
"""

from __future__ import annotations

from lightning_modules.lice.module import LiceLitModule

__all__ = ["LiceLitModule"]
