"""Prediction entropy and the EATA sample weights shared by the entropy-minimisation TTA methods."""

from __future__ import annotations

import math

import torch


def softmax_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of ``softmax(logits)`` per row, ``H(p) = -sum_c p_c log p_c`` (Tent, Eq. (1)).

    Args:
        logits: ``[B, C]``.

    Returns:
        ``[B]`` entropies in nats.
    """
    return -(logits.softmax(-1) * logits.log_softmax(-1)).sum(-1)


def default_margin(num_classes: int, fraction: float = 0.4) -> float:
    """EATA's entropy margin ``E0 = fraction * ln C`` (Niu et al. 2022, used by SAR and the SuMi paper)."""
    return fraction * math.log(num_classes)


def eata_weights(entropy: torch.Tensor, margin: float) -> torch.Tensor:
    """EATA's sample weights ``S(x) = 1 / exp(H(x) - E0)`` (EATA Eq. (6), SuMi Eq. (7)); gradient-free.

    Args:
        entropy: ``[B]`` prediction entropies.
        margin: ``E0``.

    Returns:
        ``[B]`` positive weights, detached.
    """
    return torch.exp(-(entropy.detach() - margin))
