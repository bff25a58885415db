"""Vectorised retrieval recall of TULIP == torchmetrics' RetrievalRecall; R@1 by caption length by hand."""

from __future__ import annotations

import pytest
import torch
from torchmetrics.retrieval import RetrievalRecall

from lightning_modules.tulip.metrics import pair_ranks, r1_by_length, recall_at_k


def _torchmetrics_recall(sim: torch.Tensor, k: int) -> float:
    n = sim.shape[0]
    metric = RetrievalRecall(top_k=k)
    indexes = torch.arange(n)[:, None].expand(n, n)
    return 100.0 * metric(sim.flatten(), torch.eye(n, dtype=torch.bool).flatten(), indexes=indexes.flatten()).item()


def test_recall_matches_torchmetrics_both_ways():
    torch.manual_seed(0)
    img = torch.nn.functional.normalize(torch.randn(50, 8, dtype=torch.float64), dim=-1)
    txt = torch.nn.functional.normalize(img + 0.8 * torch.randn(50, 8, dtype=torch.float64), dim=-1)
    ours = recall_at_k(img, txt)
    sim = img @ txt.T
    for k in (1, 5, 10):
        assert ours[f"i2t_r{k}"] == pytest.approx(_torchmetrics_recall(sim, k))
        assert ours[f"t2i_r{k}"] == pytest.approx(_torchmetrics_recall(sim.T, k))
    assert 0 < ours["i2t_r1"] < ours["i2t_r5"] < ours["i2t_r10"] < 100


def test_ties_count_against_the_query_and_length_bins():
    sim = torch.tensor([[1.0, 1.0, 0.0], [0.0, 2.0, 1.0], [0.0, 0.0, 0.5]])
    assert pair_ranks(sim).tolist() == [1, 0, 0]
    feats = torch.eye(4, dtype=torch.float64)
    txt = feats[[0, 2, 1, 3]]  # pairs 0 and 3 right both ways, 1 and 2 wrong
    bins = r1_by_length(feats, txt, torch.tensor([50, 90, 95, 130]), [80, 100, 120])
    assert bins == {"lt80": (100.0, 1), "80_100": (0.0, 2), "ge120": (100.0, 1)}
