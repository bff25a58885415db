"""Quantization-aware rewrites of the suite's models (OSTQuant)."""
