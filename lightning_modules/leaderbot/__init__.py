"""leaderbot: statistical ranking of Chatbot Arena battles (Ameli et al., ICLR 2025). See docs/methods/leaderbot.md."""

from __future__ import annotations

from lightning_modules.leaderbot.module import LeaderbotLitModule

__all__ = ["LeaderbotLitModule"]
