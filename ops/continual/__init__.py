"""Continual-learning protocol metrics (pure functions)."""
