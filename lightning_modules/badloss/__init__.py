"""BaDLoss: backdoor detection via loss dynamics (ICLR 2025), with its baselines. See docs/methods/badloss.md."""

from __future__ import annotations

from lightning_modules.badloss.module import DEFENCES, BadlossLitModule

__all__ = ["DEFENCES", "BadlossLitModule"]
