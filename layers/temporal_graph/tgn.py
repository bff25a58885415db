"""TGN (Rossi et al., 2020): a GRU memory per node, updated from interaction messages, plus the graph-attention
embedding of TGAT on top of it (the paper's TGN-attn; one of N-ForGOT's backbones).

Memory (TGN Sec. 3.1, Eqs. (1)-(3), with the identity message, the last-message aggregator and the GRU updater of
the paper's default configuration):

    m_i(t) = [s_i(t-) || s_j(t-) || e_ij(t) || Phi_m(t - t_i^-)]        (identity message; e = 0: no edge features)
    mbar_i = the message of i's latest event in the batch               (last aggregator)
    s_i    = GRU(mbar_i, s_i(t-))                                        (memory updater)

The events are fed in fixed chunks of ``memory_batch`` consecutive events of the time-ordered stream (TGN's
training batches): inside a chunk every message is computed from the memory as it was before the chunk. The
parameters are PyG's ``TGNMemory`` (its ``IdentityMessage``, ``LastAggregator``, ``TimeEncoder`` and ``GRUCell``);
the stepping is written here because the suite queries the memory at arbitrary times (old tasks are re-evaluated
after new ones, replay draws old queries), which PyG's single running state cannot answer. Every chunk's updates
are kept in a history (node, chunk) -> s, so the memory of node ``u`` "as of" any chunk boundary is one
``searchsorted`` away; ``TGNMemory.update_state`` (eval mode) is the naive twin of the stepping (parity test).

No leakage: a query at time ``t`` reads the memory after chunk ``c(t) - 1``, where chunk ``c(t)`` holds the first
event with time ``>= t``; every event in chunks ``< c(t)`` is strictly earlier than ``t``. The earlier events of
chunk ``c(t)`` reach the query only through the attention over its most recent neighbours (TGN's batch staleness).
All nodes of a query's receptive field read the memory at the query's boundary.

Embedding (TGN Sec. 3.2, graph attention): TGAT's layers (``layers/temporal_graph/tgat.py``) with
``h^0_j = s_j + W_in x_j`` (memory plus projected node features).

Gradients: memory rows computed by a forward call carry gradients to the memory parameters; rows kept from earlier
calls are detached (TGN truncates back-propagation at the batch). With time-ordered training batches each step
computes the chunks between the previous batch and its own, so the memory modules learn from every batch.

Memory handling: one history per event stream (per task: each task is its own temporal graph) and per mode. Entering
``eval()`` drops the eval histories (parameters changed since), entering ``train()`` drops the training ones (TGN
re-initialises the memory at each epoch start); ``reset_memory()`` drops all (e.g. before copying the model).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch_geometric.nn.models.tgn import IdentityMessage, LastAggregator, TGNMemory

from layers.temporal_graph.sampler import TemporalNeighborSampler
from layers.temporal_graph.tgat import TGAT


@dataclass
class MemoryHistory:
    """Memory updates of one event stream: ``keys = node * stride + chunk`` (sorted) -> ``values [H, D]``.

    ``memory [N, D]`` / ``last [N]`` is the running state after ``done`` chunks (detached).
    """

    memory: Tensor
    last: Tensor
    done: int
    keys: Tensor
    values: Tensor
    stride: int


class MemoryParameters(TGNMemory):
    """PyG's ``TGNMemory`` as the holder of the memory parameters only: its own running state is unused, so
    switching modes does not flush it (``TGNMemory.train(False)`` would apply its pending messages)."""

    def train(self, mode: bool = True) -> MemoryParameters:
        return nn.Module.train(self, mode)


class Histories(dict):
    """``(id(stream), training) -> MemoryHistory``; a copy of the model starts with none (they hold non-leaf
    tensors of the original's autograd graph, and are recomputed on demand)."""

    def __deepcopy__(self, memo: dict) -> Histories:
        return Histories()


@dataclass
class MemorySnapshot:
    """What the receptive field of each query row reads: the history (live rows carry gradients) and, per row, the
    chunk boundary ``b`` (the memory after chunks ``0 .. b - 1``)."""

    history: MemoryHistory
    boundary: Tensor

    def lookup(self, nodes: Tensor) -> Tensor:
        """``[B, D]`` memory of ``nodes[i]`` after the chunks before ``boundary[i]`` (zeros: never updated)."""
        h = self.history
        nodes = nodes.to(h.keys.device).long()
        if h.keys.numel() == 0:
            return h.values.new_zeros(nodes.numel(), h.values.shape[1])
        pos = torch.searchsorted(h.keys, nodes * h.stride + self.boundary) - 1  # latest update with chunk < b
        ok = pos >= 0
        pos = pos.clamp_min(0)
        ok &= torch.div(h.keys[pos], h.stride, rounding_mode="floor") == nodes
        return torch.where(ok.unsqueeze(1), h.values[pos], torch.zeros_like(h.values[pos]))


def memory_chunk_step(
    mem: TGNMemory, memory: Tensor, last: Tensor, src: Tensor, dst: Tensor, t: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One chunk of events -> (new ``memory [N, D]``, new ``last [N]``, updated nodes ``[U]``, their rows ``[U, D]``).

    Messages use the memory before the chunk (TGN Eq. (1)); each node takes the message of its latest event in the
    chunk (ties: the later event in the list); ``s = GRU(mbar, s)``; ``last`` = the time of that event.
    """
    m = src.numel()
    node = torch.cat([src, dst])
    tt = torch.cat([t, t])
    raw = memory.new_zeros(2 * m, mem.raw_msg_dim)  # no edge features (the N-ForGOT code feeds zeros)
    enc = mem.time_enc((tt - last[node]).to(memory.dtype))
    msg = torch.cat(
        [
            mem.msg_s_module(memory[src], memory[dst], raw[:m], enc[:m]),
            mem.msg_d_module(memory[dst], memory[src], raw[m:], enc[m:]),
        ]
    )
    uniq, inv = torch.unique(node, return_inverse=True)
    order = torch.arange(m, device=memory.device).double()
    key = torch.cat([order, order + 0.5])  # event order in the chunk: strictly increasing, so "last" is unique
    aggr = mem.aggr_module(msg, inv, key, uniq.numel())
    rows = mem.gru(aggr, memory[uniq])
    new_last = last.clone()
    new_last[uniq] = torch.zeros_like(last[uniq]).scatter_reduce(0, inv, tt, "amax", include_self=False)
    return memory.index_put((uniq,), rows), new_last, uniq, rows


def naive_memory(mem: TGNMemory, num_nodes: int, src: Tensor, dst: Tensor, t: Tensor, chunk: int) -> list[Tensor]:
    """Readable twin of the stepping: per chunk, per node, find its latest event, build its message, one GRU step.

    Returns ``[memory after 0 chunks, after 1 chunk, ...]`` (each ``[N, D]``), with gradients.
    """
    dtype = mem.gru.weight_ih.dtype
    memory = torch.zeros(num_nodes, mem.memory_dim, dtype=dtype)
    last = torch.zeros(num_nodes, dtype=torch.float64)
    states = [memory]
    for lo in range(0, src.numel(), chunk):
        s, d, tc = src[lo : lo + chunk], dst[lo : lo + chunk], t[lo : lo + chunk]
        latest: dict[int, tuple[int, int, float, bool]] = {}
        for e in range(s.numel()):  # later events overwrite earlier ones: the last message wins
            latest[int(s[e])] = (int(s[e]), int(d[e]), float(tc[e]), True)
            latest[int(d[e])] = (int(d[e]), int(s[e]), float(tc[e]), False)
        rows, new_last = {}, last.clone()
        for u, (_, v, te, is_src) in latest.items():
            enc = mem.time_enc(torch.tensor([te - float(last[u])], dtype=dtype))
            f = mem.msg_s_module if is_src else mem.msg_d_module
            msg = f(memory[u : u + 1], memory[v : v + 1], torch.zeros(1, mem.raw_msg_dim, dtype=dtype), enc)
            rows[u] = mem.gru(msg, memory[u : u + 1])[0]
            new_last[u] = te
        memory = torch.stack([rows.get(u, memory[u]) for u in range(num_nodes)])
        last = new_last
        states.append(memory)
    return states


class TGN(TGAT):
    """TGN-attn: GRU memory (see the module docstring) + TGAT graph attention over ``s_j + W_in x_j``.

    Args:
        in_dim, dim, time_dim, num_layers, heads, num_neighbors, dropout: as :class:`TGAT` (memory width = ``dim``;
            the memory's own time encoding has ``time_dim`` too).
        memory_batch: events per memory chunk (TGN's batch size; 200 in the official runs).
    """

    def __init__(
        self,
        in_dim: int,
        dim: int = 64,
        time_dim: int = 32,
        num_layers: int = 1,
        heads: int = 2,
        num_neighbors: int = 10,
        dropout: float = 0.1,
        memory_batch: int = 200,
    ) -> None:
        super().__init__(in_dim, dim, time_dim, num_layers, heads, num_neighbors, dropout)
        if memory_batch < 1:
            raise ValueError(f"memory_batch={memory_batch} must be >= 1")
        self.memory_batch = memory_batch
        # Parameters only: num_nodes=1 (its buffers are unused; each stream keeps its own state).
        self.memory = MemoryParameters(1, 1, dim, time_dim, IdentityMessage(1, dim, time_dim), LastAggregator())
        self._histories = Histories()

    def reset_memory(self) -> None:
        """Forget every stream's memory (it is recomputed on the next query)."""
        self._histories.clear()

    def train(self, mode: bool = True) -> TGN:
        hist = getattr(self, "_histories", None)
        for key in [k for k in (hist or {}) if k[1] == mode]:  # entering a mode: its memories are stale
            del hist[key]
        return super().train(mode)

    def _history(self, sampler: TemporalNeighborSampler, upto: int) -> MemoryHistory:
        """The stream's history with at least ``upto`` chunks; chunks computed now carry gradients."""
        key = (id(sampler), self.training)
        src, dst, t = sampler.events
        dev, dtype = self.memory.gru.weight_ih.device, self.memory.gru.weight_ih.dtype
        n = sampler.num_nodes
        num_chunks = -(-src.numel() // self.memory_batch)
        h = self._histories.get(key)
        if h is None:
            h = MemoryHistory(
                torch.zeros(n, self.dim, device=dev, dtype=dtype),
                torch.zeros(n, dtype=torch.float64, device=dev),
                0,
                torch.zeros(0, dtype=torch.long, device=dev),
                torch.zeros(0, self.dim, device=dev, dtype=dtype),
                num_chunks + 1,
            )
        if upto <= h.done:
            return h
        memory, last = h.memory, h.last
        keys, values = [h.keys], [h.values]
        for c in range(h.done, upto):
            lo, hi = c * self.memory_batch, (c + 1) * self.memory_batch
            s, d, tc = src[lo:hi].to(dev), dst[lo:hi].to(dev), t[lo:hi].to(dev)
            memory, last, uniq, rows = memory_chunk_step(self.memory, memory, last, s, d, tc)
            keys.append(uniq * h.stride + c)
            values.append(rows)
        keys_all, values_all = torch.cat(keys), torch.cat(values)
        order = torch.argsort(keys_all)
        live = MemoryHistory(memory, last, upto, keys_all[order], values_all[order], h.stride)
        self._histories[key] = MemoryHistory(memory.detach(), last, upto, live.keys, live.values.detach(), h.stride)
        return live

    def boundary(self, sampler: TemporalNeighborSampler, times: Tensor) -> Tensor:
        """``[B]`` chunk boundary of each query time: the chunk holding the first event with time ``>= t``."""
        first_late = torch.searchsorted(sampler.events[2], times.cpu().double(), right=False)
        return torch.div(first_late, self.memory_batch, rounding_mode="floor")

    def context(self, sampler: TemporalNeighborSampler, nodes: Tensor, times: Tensor) -> MemorySnapshot:
        b = self.boundary(sampler, times)
        hist = self._history(sampler, int(b.max()) if b.numel() else 0)
        return MemorySnapshot(hist, b.to(hist.keys.device))

    def expand_context(self, ctx: MemorySnapshot, k: int) -> MemorySnapshot:
        return MemorySnapshot(ctx.history, ctx.boundary.repeat_interleave(k))

    def base(self, x: Tensor, nodes: Tensor, ctx: MemorySnapshot) -> Tensor:
        return self.inp(x[nodes.to(x.device)]) + ctx.lookup(nodes).to(x.device)
