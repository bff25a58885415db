"""Temporal neighbour sampler (fast vs naive twin, no leakage), the TGAT encoder and the TGN memory + encoder."""

from __future__ import annotations

import copy

import pytest
import torch
from torch_geometric.nn.models.tgn import LastNeighborLoader

from layers.temporal_graph.sampler import TemporalNeighborSampler, naive_temporal_neighbors
from layers.temporal_graph.tgat import TGAT
from layers.temporal_graph.tgn import TGN, MemorySnapshot, naive_memory


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


# -- TGN: memory stepping (PyG TGNMemory and a naive twin), no leakage, gradients, memory handling -----------------


def distinct_stream(n=12, e=60, seed=0):
    """Distinct integer times (PyG's TGNMemory keeps integer times; no ties, so "last message" is unambiguous)."""
    g = torch.Generator().manual_seed(seed)
    src, dst = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    t = (torch.randperm(400, generator=g)[:e].sort().values + 1).double()
    return n, src, dst, t, g


def tiny_tgn(chunk=7, layers=1):
    torch.manual_seed(0)
    return TGN(
        in_dim=5, dim=8, time_dim=4, num_layers=layers, heads=2, num_neighbors=3, dropout=0.0, memory_batch=chunk
    ).double()


def test_tgn_memory_matches_pyg_tgnmemory_and_the_naive_twin():
    n, src, dst, t, _ = distinct_stream()
    model = tiny_tgn()
    s = TemporalNeighborSampler(n, src, dst, t)
    states = naive_memory(model.memory, n, *s.events, 7)
    hist = model._history(s, len(states) - 1)
    fast = [MemorySnapshot(hist, torch.full((n,), c)).lookup(torch.arange(n)) for c in range(len(states))]
    for c in range(len(states)):
        torch.testing.assert_close(fast[c], states[c], rtol=1e-12, atol=1e-12)
    # gradients of the fast stepping equal the twin's
    w = torch.randn(len(states), n, 8, dtype=torch.double)
    gf = torch.autograd.grad(sum((f * wc).sum() for f, wc in zip(fast, w)), list(model.memory.parameters()))
    gs = torch.autograd.grad(sum((f * wc).sum() for f, wc in zip(states, w)), list(model.memory.parameters()))
    for a, b in zip(gf, gs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        assert a.abs().sum() > 0
    # PyG's own TGNMemory (eval mode: messages applied at once), fed the same chunks with the same parameters
    pyg = copy.deepcopy(model.memory)
    pyg.num_nodes, pyg.training = n, False
    pyg.memory, pyg.last_update = torch.zeros(n, 8, dtype=torch.double), torch.zeros(n, dtype=torch.long)
    pyg._assoc = torch.zeros(n, dtype=torch.long)
    pyg._reset_message_store()
    S, D, T = s.events
    with torch.no_grad():
        for c in range(len(states) - 1):
            sl = slice(7 * c, 7 * c + 7)
            pyg.update_state(S[sl], D[sl], T[sl].long(), torch.zeros(S[sl].numel(), 1, dtype=torch.double))
            torch.testing.assert_close(pyg.memory, fast[c + 1].detach(), rtol=1e-12, atol=1e-12)


def test_sampler_agrees_with_pyg_last_neighbor_loader_on_a_stream():
    n, src, dst, t, _ = distinct_stream(seed=4)
    s = TemporalNeighborSampler(n, src, dst, t)
    loader = LastNeighborLoader(n, size=4)
    for p in (0, 13, 40, 60):  # stream the events before time t[p] into PyG's loader, then compare
        loader.reset_state()
        for lo in range(0, p, 9):
            hi = min(lo + 9, p)
            loader.insert(src[lo:hi], dst[lo:hi])
        tq = torch.full((n,), float(t[p]) if p < len(t) else 1e9, dtype=torch.double)
        nb = s.sample(torch.arange(n), tq, 4)
        for u in range(n):
            ours = sorted(nb.events[u][nb.mask[u]].tolist())
            theirs = sorted(e for e in loader.e_id[u].tolist() if e >= 0)
            assert ours == theirs, (p, u)


def test_tgn_embedding_ignores_events_at_or_after_the_query_time():
    n, src, dst, t, g = random_stream(seed=2)
    model = tiny_tgn(chunk=9, layers=2).eval()
    x = torch.randn(n, 5, dtype=torch.double)
    qn, qt = torch.arange(n), torch.full((n,), 12.0, dtype=torch.double)
    before = model(x, TemporalNeighborSampler(n, src, dst, t), qn, qt)
    late = t >= 12
    m = int(late.sum())
    src2, dst2 = src.clone(), dst.clone()  # rewire every event at or after 12 and add more at exactly 12
    src2[late], dst2[late] = torch.randint(0, n, (m,), generator=g), torch.randint(0, n, (m,), generator=g)
    extra = torch.randint(0, n, (2, 30), generator=g)
    s2 = TemporalNeighborSampler(
        n,
        torch.cat([src2, extra[0]]),
        torch.cat([dst2, extra[1]]),
        torch.cat([t, torch.full((30,), 12.0, dtype=torch.double)]),
    )
    model.eval()  # fresh memory for the new stream (and drop the old one)
    after = model(x, s2, qn, qt)
    torch.testing.assert_close(before, after, rtol=0, atol=0)
    model.eval()
    src3 = src.clone()
    src3[~late] = (src3[~late] + 1) % n  # an earlier event changes: the memory and embeddings move
    assert (model(x, TemporalNeighborSampler(n, src3, dst, t), qn, qt) - before).abs().max() > 1e-6
    # the memory rows read for a query come only from chunks whose events are all strictly earlier
    s = TemporalNeighborSampler(n, src, dst, t)
    b = model.boundary(s, qt)
    assert (s.events[2][: int(b[0]) * 9] < 12).all()


def test_tgn_gradients_reach_every_parameter_and_memory_is_per_stream_and_mode():
    n, src, dst, t, g = random_stream(seed=3)
    model = tiny_tgn(chunk=10).float()
    x = torch.randn(n, 5)
    s = TemporalNeighborSampler(n, src, dst, t)
    qn, qt = torch.randint(0, n, (32,), generator=g), torch.randint(0, 26, (32,), generator=g).double()
    h, sub = model.subtree(x, s, qn, qt)
    (h.pow(2).sum() + sub.sum()).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert (id(s), True) in model._histories and copy.deepcopy(model)._histories == {}  # copies start empty
    model.eval()
    with torch.no_grad():
        e1 = model(x, s, qn, qt)
        model.memory.gru.weight_hh.add_(0.5)
        assert torch.equal(model(x, s, qn, qt), e1)  # same eval pass: the stored memory is reused
        model.train()
        model.eval()  # entering eval again recomputes the memory with the new parameters
        assert (model(x, s, qn, qt) - e1).abs().max() > 1e-6
    other = TemporalNeighborSampler(n, src[:10], dst[:10], t[:10])  # another task's stream has its own memory
    with torch.no_grad():
        model(x, other, qn, qt)
    assert {(id(s), False), (id(other), False)} <= set(model._histories)
