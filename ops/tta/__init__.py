"""Pure tensor functions of test-time adaptation objectives (Tent, EATA, SAR, SuMi); no parameters, no Lightning."""

from __future__ import annotations

from ops.tta.entropy import eata_weights, softmax_entropy
from ops.tta.sumi import (
    balance_term,
    iqr_smoothing_mask,
    mutual_info_sharing,
    sumi_objective,
    unimodal_assist_mask,
)

__all__ = [
    "balance_term",
    "eata_weights",
    "iqr_smoothing_mask",
    "mutual_info_sharing",
    "softmax_entropy",
    "sumi_objective",
    "unimodal_assist_mask",
]
