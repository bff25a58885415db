"""Temporal neighbour sampling: the ``k`` most recent interactions of a node strictly before a query time.

TGAT/TGN-style encoders embed node ``u`` at time ``t`` from the events ``(u, v, t_e)`` with ``t_e < t`` only: an
event at or after the query time must never be used (that would leak the future, including the event being
classified). :class:`TemporalNeighborSampler` answers a batch of queries with tensor ops only (one
``searchsorted`` into a (node, time)-sorted event table, then a gather); :func:`naive_temporal_neighbors` is its
readable per-query twin, used by the parity and no-leakage tests.

PyG's ``LastNeighborLoader`` keeps the last ``k`` neighbours of a *stream* (the TGN training regime, where queries
arrive in time order); TGAT needs arbitrary query times (old tasks are re-evaluated after new ones), hence this.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Neighbors:
    """Result of a query batch of size ``B``: ``[B, k]`` tensors, padded on the left where fewer than ``k`` exist.

    Attributes:
        nodes: neighbour ids (0 where padded).
        times: event times (the query time where padded, so ``t - t_e = 0`` there).
        events: event ids into the sampler's event list (-1 where padded).
        mask: True where the slot holds a real event. Slots are ordered oldest to newest.
    """

    nodes: Tensor
    times: Tensor
    events: Tensor
    mask: Tensor


class TemporalNeighborSampler:
    """The ``k`` most recent neighbours of each query ``(node, time)`` among events strictly before ``time``.

    Events are treated as undirected (each event ``(s, d, t)`` is an interaction of both ``s`` and ``d``), as TGAT's
    neighbour finder does. Ties in time keep the order of the event list.

    Args:
        num_nodes: number of nodes ``N``.
        src, dst: ``[E]`` endpoint ids.
        t: ``[E]`` event times (any order; int or float).
    """

    def __init__(self, num_nodes: int, src: Tensor, dst: Tensor, t: Tensor) -> None:
        src, dst, t = src.long(), dst.long(), t.double()
        chrono = torch.argsort(t, stable=True)  # the event stream in time order (ties: list order), for TGN memory
        self.events = (src[chrono], dst[chrono], t[chrono])
        e = torch.arange(src.numel())
        node = torch.cat([src, dst])
        nbr = torch.cat([dst, src])
        time = torch.cat([t, t])
        eid = torch.cat([e, e])
        # Exact integer time ranks so that (node, rank) packs into one sortable int64 key.
        self.unique_times = torch.unique(time)
        rank = torch.searchsorted(self.unique_times, time)
        self.stride = int(self.unique_times.numel()) + 1
        key = node * self.stride + rank
        order = torch.argsort(key, stable=True)  # stable: ties keep (src side by event id, then dst side)
        self.key, self.nbr, self.time, self.eid = key[order], nbr[order], time[order], eid[order]
        self.num_nodes = num_nodes
        self.ptr = torch.searchsorted(self.key, torch.arange(num_nodes + 1) * self.stride)

    def _end(self, nodes: Tensor, times: Tensor) -> tuple[Tensor, Tensor]:
        nodes = nodes.long()
        r = torch.searchsorted(self.unique_times, times.double())  # number of distinct times < t
        end = torch.searchsorted(self.key, nodes * self.stride + r)  # first event of `node` with time >= t
        return self.ptr[nodes], end

    def count(self, nodes: Tensor, times: Tensor) -> Tensor:
        """``[B]`` number of events of each node strictly before its query time (the temporal degree)."""
        start, end = self._end(nodes, times)
        return end - start

    def sample(self, nodes: Tensor, times: Tensor, k: int) -> Neighbors:
        """The ``k`` most recent neighbours of each ``(nodes[b], times[b])`` with event time ``< times[b]``."""
        start, end = self._end(nodes, times)
        pos = end.unsqueeze(1) - k + torch.arange(k).unsqueeze(0)  # [B, k], oldest .. newest
        mask = pos >= start.unsqueeze(1)
        pos = torch.where(mask, pos, torch.zeros_like(pos))
        if self.key.numel() == 0:  # no events at all
            zeros = torch.zeros_like(pos)
            return Neighbors(zeros, times.double().unsqueeze(1).expand_as(pos).clone(), zeros - 1, mask)
        qt = times.double().unsqueeze(1).expand_as(pos)
        return Neighbors(
            nodes=torch.where(mask, self.nbr[pos], torch.zeros_like(pos)),
            times=torch.where(mask, self.time[pos], qt),
            events=torch.where(mask, self.eid[pos], torch.full_like(pos, -1)),
            mask=mask,
        )


def naive_temporal_neighbors(
    num_nodes: int, src: Tensor, dst: Tensor, t: Tensor, nodes: Tensor, times: Tensor, k: int
) -> Neighbors:
    """Readable twin of :meth:`TemporalNeighborSampler.sample`: scan all events per query."""
    events = sorted(
        [(float(t[e]), e, int(src[e]), int(dst[e])) for e in range(src.numel())], key=lambda r: (r[0], r[1])
    )
    b = nodes.numel()
    out_n = torch.zeros(b, k, dtype=torch.long)
    out_t = times.double().unsqueeze(1).repeat(1, k)
    out_e = torch.full((b, k), -1, dtype=torch.long)
    mask = torch.zeros(b, k, dtype=torch.bool)
    for q in range(b):
        u, tq = int(nodes[q]), float(times[q])
        # each event appears as (src-side, dst-side); the src-side entries precede dst-side entries of equal time
        rows = [(te, 0, e, d) for te, e, s, d in events if s == u and te < tq]
        rows += [(te, 1, e, s) for te, e, s, d in events if d == u and te < tq]
        rows.sort(key=lambda r: (r[0], r[1], r[2]))
        last = rows[-k:] if k else []
        for j, (te, _, e, v) in enumerate(last):
            slot = k - len(last) + j
            out_n[q, slot], out_t[q, slot], out_e[q, slot], mask[q, slot] = v, te, e, True
    return Neighbors(out_n, out_t, out_e, mask)
