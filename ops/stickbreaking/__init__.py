"""Stick-breaking attention (ICLR 2025): O(T^2) log-space reference and a blockwise online implementation."""

from __future__ import annotations

from ops.stickbreaking.blockwise import blockwise_stickbreaking
from ops.stickbreaking.naive import naive_stickbreaking, product_stickbreaking

__all__ = ["blockwise_stickbreaking", "naive_stickbreaking", "product_stickbreaking"]
