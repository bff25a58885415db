"""Outlier census functions (Systematic Outliers, ICLR 2025): activation, weight and attention outliers."""

from __future__ import annotations

from ops.outliers.census import (
    activation_outlier_mask,
    activation_outlier_stats,
    as_tokens,
    attention_sink_share,
    outlier_dimensions,
    weight_outlier_ratio,
)

__all__ = [
    "as_tokens",
    "activation_outlier_mask",
    "activation_outlier_stats",
    "attention_sink_share",
    "outlier_dimensions",
    "weight_outlier_ratio",
]
