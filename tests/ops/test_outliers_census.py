"""Outlier census functions on hand-built tensors with known outliers (systematic_outliers)."""

from __future__ import annotations

import pytest
import torch

from core.errors import ConfigError
from ops.outliers import (
    activation_outlier_mask,
    activation_outlier_stats,
    attention_sink_share,
    outlier_dimensions,
    weight_outlier_ratio,
)


def _planted() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 16, 32, generator=g) * 0.1
    h[:, 0, 7] = 5000.0  # massive activation: first token, channel 7
    h[1, 3, 19] = -4000.0  # a second one, negative, channel 19
    return h


def test_mask_finds_exactly_the_planted_entries():
    h = _planted()
    mask = activation_outlier_mask(h, k=100.0)
    assert mask.sum().item() == 3
    assert mask[0, 0, 7] and mask[1, 0, 7] and mask[1, 3, 19]


def test_stats_per_dim_per_token_ratio():
    h = _planted()
    st = activation_outlier_stats(h, k=100.0, top=3)
    assert st["topk"].tolist() == [5000.0, 5000.0, 4000.0]
    assert st["per_dim"][7].item() == 2 and st["per_dim"][19].item() == 1 and st["per_dim"].sum().item() == 3
    assert st["per_token"][0].item() == 2 and st["per_token"][3].item() == 1
    assert st["token_frac"].item() == pytest.approx(3 / 32)
    med = h.abs().flatten().median()
    assert st["ratio"].item() == pytest.approx(5000.0 / med.item(), rel=1e-6)
    assert outlier_dimensions(h, k=100.0) == [7, 19]


def test_gaussian_has_no_outliers_at_paper_threshold():
    h = torch.randn(4, 64, 32, generator=torch.Generator().manual_seed(1))
    assert activation_outlier_stats(h, k=1000.0)["count"].item() == 0
    assert outlier_dimensions(h, k=1000.0) == []


def test_threshold_is_relative_to_the_mean():
    h = torch.ones(1, 4, 4)
    h[0, 0, 0] = 30.0  # mean = (15 + 30) / 16 = 2.8125 -> 30 > 10 * 2.8125 but not > 11 * 2.8125
    assert activation_outlier_mask(h, 10.0).sum().item() == 1
    assert activation_outlier_mask(h, 11.0).sum().item() == 0
    with pytest.raises(ConfigError, match="k="):
        activation_outlier_mask(h, 0.0)


def test_weight_ratio():
    w = torch.full((4, 5), 0.5)
    w[2, 3] = -10.0
    assert weight_outlier_ratio(w).item() == pytest.approx(20.0)


def test_attention_sink_share():
    t = 5
    attn = torch.zeros(1, 2, t, t)
    attn[:, 0] = torch.eye(t)  # head 0 attends to itself only
    attn[:, 1, :, 0] = 0.75  # head 1 puts 0.75 on token 0 and 0.25 on itself
    attn[:, 1] += 0.25 * torch.eye(t)
    share = attention_sink_share(attn)
    assert share.tolist() == pytest.approx([0.0, 0.75])
    assert attention_sink_share(attn, skip_first_query=False).tolist() == pytest.approx([0.2, (0.75 * 4 + 1) / 5])
    low_info = torch.tensor([False, False, True, False, False])  # sink = a delimiter at position 2
    assert attention_sink_share(attn, key_mask=low_info).tolist() == pytest.approx([0.25, 0.0625])
