"""Vectorised retrieval recall of TULIP == torchmetrics' RetrievalRecall (no ties); ties at their expected credit,
the pessimistic value beside it; R@1 by caption length by hand."""

from __future__ import annotations

import pytest
import torch
from torchmetrics.retrieval import RetrievalRecall

from lightning_modules.tulip.metrics import hit_credit, pair_ranks, r1_by_length, recall_at_k


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
    for key in ("i2t_r1", "t2i_r5", "i2t_r10"):  # no ties: both conventions agree
        assert ours[f"{key}_pessimistic"] == ours[key]


def test_ties_get_their_expected_credit_and_the_pessimistic_value_beside():
    # 4 images; captions 0-2 are identical (a truncating encoder on siblings): bitwise-tied text features
    img = torch.eye(4, dtype=torch.float64)
    txt = torch.tensor([[1.0, 1.0, 1.0, 0.0]] * 3 + [[0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    out = recall_at_k(img, txt, ks=(1, 2, 5))
    # I2T: images 0-2 each see their caption tied with 2 others at the top: credit 1/3 each at K=1, 2/3 at K=2;
    # image 3 is a clean hit. Pessimistic: only image 3.
    assert out["i2t_r1"] == pytest.approx(100 * (3 * (1 / 3) + 1) / 4)
    assert out["i2t_r2"] == pytest.approx(100 * (3 * (2 / 3) + 1) / 4)
    assert out["i2t_r5"] == pytest.approx(100.0)
    assert out["i2t_r1_pessimistic"] == pytest.approx(25.0) and out["i2t_r2_pessimistic"] == pytest.approx(25.0)
    # a tie below a strictly higher item gets nothing at K=1; at K=2 the tied block of 2 shares one slot
    sim = torch.tensor([[1.0, 2.0, 1.0], [0.0, 2.0, 1.0], [0.0, 0.0, 0.5]])
    torch.testing.assert_close(hit_credit(sim, 1), torch.tensor([0.0, 1.0, 1.0]))
    torch.testing.assert_close(hit_credit(sim, 2), torch.tensor([0.5, 1.0, 1.0]))
    bins = r1_by_length(img, txt, torch.tensor([50, 50, 50, 130]), [80])
    assert bins["lt80"][0] == pytest.approx(100 * (1 / 3 + 1 / 3) / 2) and bins["ge80"] == (100.0, 1)


def test_pessimistic_ranks_and_length_bins():
    sim = torch.tensor([[1.0, 1.0, 0.0], [0.0, 2.0, 1.0], [0.0, 0.0, 0.5]])
    assert pair_ranks(sim).tolist() == [1, 0, 0]
    feats = torch.eye(4, dtype=torch.float64)
    txt = feats[[0, 2, 1, 3]]  # pairs 0 and 3 right both ways, 1 and 2 wrong
    bins = r1_by_length(feats, txt, torch.tensor([50, 90, 95, 130]), [80, 100, 120])
    assert bins == {"lt80": (100.0, 1), "80_100": (0.0, 2), "ge120": (100.0, 1)}
