"""Temporal neighbour sampler (fast vs naive twin, no leakage) and the TGAT encoder."""

from __future__ import annotations

import pytest
import torch

from layers.temporal_graph.sampler import TemporalNeighborSampler, naive_temporal_neighbors
from layers.temporal_graph.tgat import TGAT


def random_stream(n=15, e=120, t_max=25, seed=0):
    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    t = torch.randint(0, t_max, (e,), generator=g).double()  # many ties, self-loops possible
    return n, src, dst, t, g


@pytest.mark.parametrize("k", [1, 4, 30])
def test_sampler_matches_naive_twin(k):
    n, src, dst, t, g = random_stream()
    qn, qt = torch.randint(0, n, (60,), generator=g), torch.randint(-1, 27, (60,), generator=g).double()
    fast = TemporalNeighborSampler(n, src, dst, t).sample(qn, qt, k)
    slow = naive_temporal_neighbors(n, src, dst, t, qn, qt, k)
    for f in ("nodes", "times", "events", "mask"):
        assert torch.equal(getattr(fast, f), getattr(slow, f)), f
    assert fast.mask.sum() > 0 and (~fast.mask).sum() > 0  # both full and padded rows are exercised


def test_sampler_never_returns_an_event_at_or_after_the_query_time():
    n, src, dst, t, g = random_stream(seed=1)
    s = TemporalNeighborSampler(n, src, dst, t)
    qn, qt = torch.randint(0, n, (200,), generator=g), torch.randint(0, 26, (200,), generator=g).double()
    nb = s.sample(qn, qt, 8)
    assert (nb.times[nb.mask] < qt.unsqueeze(1).expand_as(nb.times)[nb.mask]).all()
    ev = nb.events[nb.mask]
    assert (t[ev] < qt.unsqueeze(1).expand_as(nb.times)[nb.mask]).all()
    # each returned event touches the query node, and the count is the number of strictly earlier events
    rows = torch.nonzero(nb.mask)[:, 0]
    assert ((src[ev] == qn[rows]) | (dst[ev] == qn[rows])).all()
    expect = torch.tensor([int(((src == u) & (t < tq)).sum() + ((dst == u) & (t < tq)).sum()) for u, tq in zip(qn, qt)])
    assert torch.equal(s.count(qn, qt), expect)


def test_tgat_embedding_ignores_events_at_or_after_the_query_time():
    n, src, dst, t, g = random_stream(seed=2)
    torch.manual_seed(0)
    model = TGAT(in_dim=5, dim=16, time_dim=8, num_layers=2, heads=2, num_neighbors=4, dropout=0.0).double().eval()
    x = torch.randn(n, 5, dtype=torch.double)
    qn, qt = torch.arange(n), torch.full((n,), 12.0, dtype=torch.double)
    before = model(x, TemporalNeighborSampler(n, src, dst, t), qn, qt)
    # rewire every event at time >= 12 (including the ties at exactly 12): the embeddings at t = 12 must not move
    late = t >= 12
    src2, dst2 = src.clone(), dst.clone()
    m = int(late.sum())
    src2[late], dst2[late] = torch.randint(0, n, (m,), generator=g), torch.randint(0, n, (m,), generator=g)
    after = model(x, TemporalNeighborSampler(n, src2, dst2, t), qn, qt)
    torch.testing.assert_close(before, after, rtol=0, atol=0)
    # ... while changing an earlier event does move them (the test can fail)
    src3 = src.clone()
    src3[~late] = (src3[~late] + 1) % n
    moved = model(x, TemporalNeighborSampler(n, src3, dst, t), qn, qt)
    assert (moved - before).abs().max() > 1e-6


def test_tgat_shapes_grads_and_isolated_nodes():
    n, src, dst, t, g = random_stream(seed=3)
    model = TGAT(in_dim=5, dim=16, time_dim=8, num_layers=1, heads=2, num_neighbors=4)
    x = torch.randn(n, 5)
    s = TemporalNeighborSampler(n, src, dst, t)
    qn, qt = torch.randint(0, n, (32,), generator=g), torch.randint(0, 26, (32,), generator=g).double()
    qt[0] = -5.0  # no earlier event at all: zero attention, finite output
    h, sub = model.subtree(x, s, qn, qt)
    assert h.shape == (32, 16) and sub.shape == (32, 5, 16)
    assert torch.isfinite(sub).all() and torch.equal(sub[0, :4], torch.zeros(4, 16))
    (h.pow(2).sum() + sub.sum()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
