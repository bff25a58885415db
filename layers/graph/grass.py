"""GRASS: Graph Attention with Stochastic Structures (ICLR 2025): layer, norms, pooling head and full network.

The GRASS layer ("additive attention") updates node states ``x`` ``[N, D]`` and edge states ``e``
``[E, D]`` of a graph whose edges go head ``h`` -> tail ``t``::

    [s_i, n_i, a_i, b_i] = W_node x_i                                   (4H, no bias)        Eq. (4)
    [c_e, m_e, q_e]      = W_edge e_e                                   (3H, no bias)        Eq. (5)
    w_e   = exp(q_e - stopgrad(max_{e' -> t} q_e')) (per channel), then random edge removal (dropout), + sqrt(eps)
    r_t   = sum_{e -> t} (n_h + m_e) * w_e / (sum_{e -> t} w_e + eps)   per-channel softmax   Eq. (6)
    x_t'  = BN(x_t + rs * W_xo(mish(r_t + s_t + beta_x)))                                    Eq. (7)
    e'    = BN(e + rs * W_eo(mish(a_h + b_t + c_e + beta_e)))                                Eq. (8)

Equation numbers (Eq. (1)-(10)) follow the numbered list in ``docs/methods/grass.md``: the paper's own numbering
could not be checked offline. The attention score depends only on the edge state; the node pair enters the next
layer through ``a_h + b_t``. With ``alternate_edge_direction`` every second layer swaps heads and tails. BN is a no-
affine batch norm with Bessel-corrected variance (eps 1e-7). The network (:class:`GrassNet`) adds self-loops and a
fresh random regular graph to every input graph, embeds atom/bond types plus RRWP or D-RRWP encodings (see
``grass_encodings``), stacks GRASS layers and reads out with :class:`PoolingHead` (separate sums over nodes,
existing and added edges).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing
from torch_geometric.utils import degree, scatter

from core.errors import ConfigError
from layers.graph.grass_encodings import (
    batched_drrwp,
    batched_random_regular_edges,
    batched_rrwp,
    pair_encoding,
)

ENCODINGS = ("rrwp", "drrwp", "none")


class NoAffineBatchNorm(nn.Module):
    """Batch norm without affine parameters; variance with Bessel's correction (the official ``BatchNorm``).

    ``momentum=None`` accumulates a cumulative average (used to re-collect statistics before evaluation).

    Args:
        dim: Feature size ``D``; inputs are ``[*, D]``.
        eps: Added to the variance.
        momentum: Running-statistics momentum, or ``None`` for a cumulative average.
    """

    def __init__(self, dim: int, eps: float = 1e-7, momentum: float | None = 0.1) -> None:
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def reset_running_stats(self) -> None:
        self.running_mean.zero_()
        self.running_var.fill_(1.0)
        self.num_batches_tracked.zero_()

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if self.training and flat.shape[0] > 1:
            mean = flat.mean(0)
            # Bessel-corrected variance from the centred input, which is reused for the output: on CPU this is
            # several times faster than ``Tensor.var(0)``, same value (float64 parity test in test_grass_layer.py).
            centred = flat - mean
            var = (centred * centred).sum(0) / (flat.shape[0] - 1)
            with torch.no_grad():
                self.num_batches_tracked += 1
                m = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
                self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), m)
                self.running_var.lerp_(var.detach().to(self.running_var.dtype), m)
            return (centred * torch.rsqrt(var + self.eps)).view_as(x)
        mean, var = self.running_mean.to(x.dtype), self.running_var.to(x.dtype)
        return (x - mean) * torch.rsqrt(var + self.eps)


class RunningNorm(NoAffineBatchNorm):
    """Normalise with running statistics only (``FixedDistributionBatchNorm``): used on raw encodings.

    In training it first updates a cumulative average, then normalises with it, so the output never depends on the
    other members of the batch.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__(dim, eps=eps, momentum=None)

    def forward(self, x: Tensor) -> Tensor:
        if self.training and x.shape[0] > 1:
            super().forward(x)  # update the cumulative statistics
        return (x - self.running_mean.to(x.dtype)) * torch.rsqrt(self.running_var.to(x.dtype) + self.eps)


def edge_removal(w: Tensor, p: float, generator: torch.Generator | None = None) -> Tensor:
    """Fast inverted dropout ``w * keep / (1 - p)`` ("random edge removal" on the attention weights).

    Same distribution as ``F.dropout(w, p)`` (the naive twin) up to ``p`` being rounded to a multiple of ``2^-16``:
    the keep decisions come from 16-bit lanes of random 64-bit integers, four per draw, which on CPU is about 5x
    cheaper than ``F.dropout``'s per-element Bernoulli draws (the largest single cost of a GRASS step).

    Args:
        w: ``[E, H]`` weights.
        p: Removal probability in ``[0, 1)``.
        generator: Source of randomness (``None``: the global one).
    """
    if p <= 0.0:
        return w
    n = w.numel()
    draws = torch.randint(-(2**63), 2**63 - 1, ((n + 3) // 4,), dtype=torch.int64, device=w.device, generator=generator)
    lanes = draws.view(torch.int16)[:n].view(w.shape)  # uniform on [-2^15, 2^15)
    threshold = round(p * 65536) - 32768
    return w * (lanes >= threshold).to(w.dtype) * (1.0 / (1.0 - p))


def _kaiming(linear: nn.Linear) -> nn.Linear:
    nn.init.kaiming_uniform_(linear.weight, nonlinearity="linear")
    return linear


class GRASSLayer(MessagePassing):
    """One GRASS layer (Eq. (4)-(8)) as a PyG ``MessagePassing`` with sum aggregation of messages and weights.

    Args:
        dim: Node and edge state width ``D``.
        hidden_dim: Attention/message width ``H``.
        edge_removal_rate: Attention dropout ``p`` applied to the weights ``w_e`` ("random edge removal").
        residual_scale: ``rs`` (0.2 in the paper).
        eps: Softmax stabiliser (``r = sum(msg) / (sum(w) + eps)``, ``w += sqrt(eps)``).
        norm: Apply the no-affine batch norm after each residual update.
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        edge_removal_rate: float = 0.1,
        residual_scale: float = 0.2,
        eps: float = 1e-7,
        norm: bool = True,
    ) -> None:
        super().__init__(aggr="add", flow="source_to_target", node_dim=0)
        if not 0.0 <= edge_removal_rate < 1.0:
            raise ConfigError(f"model.edge_removal_rate={edge_removal_rate} must be in [0, 1)")
        if dim < 1 or hidden_dim < 1:
            raise ConfigError(f"model.dim={dim} and model.hidden_dim={hidden_dim} must be >= 1")
        self.hidden_dim, self.edge_removal_rate, self.residual_scale, self.eps = (
            hidden_dim,
            edge_removal_rate,
            residual_scale,
            eps,
        )
        self.removal_active = True
        self.node_in = _kaiming(nn.Linear(dim, 4 * hidden_dim, bias=False))
        self.edge_in = _kaiming(nn.Linear(dim, 3 * hidden_dim, bias=False))
        self.beta_x = nn.Parameter(torch.zeros(hidden_dim))
        self.beta_e = nn.Parameter(torch.zeros(hidden_dim))
        # No bias on the output Linears: the following batch norm removes any shift.
        self.node_out = nn.Linear(hidden_dim, dim, bias=not norm)
        self.edge_out = nn.Linear(hidden_dim, dim, bias=not norm)
        self.node_norm = NoAffineBatchNorm(dim, eps=1e-7) if norm else nn.Identity()
        self.edge_norm = NoAffineBatchNorm(dim, eps=1e-7) if norm else nn.Identity()

    def attention_weights(self, q: Tensor, tails: Tensor, num_nodes: int) -> Tensor:
        """Unnormalised per-channel weights ``w_e = exp(q_e - stopgrad(max q))`` with edge removal. ``[E, H]``."""
        qmax = scatter(q.detach(), tails, 0, dim_size=num_nodes, reduce="max")
        w = torch.exp(q - qmax.index_select(0, tails))
        if self.training and self.removal_active and self.edge_removal_rate > 0:
            w = edge_removal(w, self.edge_removal_rate)
        return w + self.eps**0.5

    def forward(self, x: Tensor, e: Tensor, edge_index: Tensor) -> tuple[Tensor, Tensor]:
        """Args: ``x`` ``[N, D]``, ``e`` ``[E, D]``, ``edge_index`` ``[2, E]`` (head -> tail). Returns ``(x', e')``."""
        s, n, a, b = self.node_in(x).chunk(4, -1)
        c, m, q = self.edge_in(e).chunk(3, -1)
        h, t = edge_index
        w = self.attention_weights(q, t, x.shape[0])
        agg = self.propagate(edge_index, n=n, m=m, w=w, size=(x.shape[0], x.shape[0]))  # [N, 2H]
        num, den = agg.split(self.hidden_dim, -1)
        r = num / (den + self.eps)
        x = self.node_norm(x + self.residual_scale * self.node_out(F.mish(r + s + self.beta_x)))
        pair = a.index_select(0, h) + b.index_select(0, t)  # index_select: cheaper backward than a[h] on CPU
        e = self.edge_norm(e + self.residual_scale * self.edge_out(F.mish(pair + c + self.beta_e)))
        return x, e

    def message(self, n_j: Tensor, m: Tensor, w: Tensor) -> Tensor:
        return torch.cat([(n_j + m) * w, w], -1)


def grass_layer_dense_reference(layer: GRASSLayer, x: Tensor, e: Tensor, edge_index: Tensor) -> tuple[Tensor, Tensor]:
    """Oracle for :class:`GRASSLayer` (eval mode): an explicit per-tail softmax, one node at a time.

    For each tail ``t`` the incoming edges' scores ``q`` ``[E_t, H]`` are softmaxed per channel (plus the layer's
    ``sqrt(eps)`` / ``eps`` terms), and ``r_t`` is the weighted mean of ``n_h + m_e``.
    """
    hd = layer.hidden_dim
    s, n, a, b = (layer.node_in(x)).split(hd, -1)
    c, m, q = (layer.edge_in(e)).split(hd, -1)
    h, t = edge_index
    rows = []
    for node in range(x.shape[0]):
        inc = (t == node).nonzero().flatten()
        if inc.numel() == 0:
            rows.append(x.new_zeros(hd))
            continue
        qi = q[inc]
        w = torch.exp(qi - qi.max(0).values.detach()) + layer.eps**0.5
        rows.append(((n[h[inc]] + m[inc]) * w).sum(0) / (w.sum(0) + layer.eps))
    r = torch.stack(rows)
    x_new = layer.node_norm(x + layer.residual_scale * layer.node_out(F.mish(r + s + layer.beta_x)))
    e_new = layer.edge_norm(e + layer.residual_scale * layer.edge_out(F.mish(a[h] + b[t] + c + layer.beta_e)))
    return x_new, e_new


class PoolingHead(nn.Module):
    """Readout (Eq. (9)): separate sums over nodes, existing edges (incl. self-loops) and added edges, a GLU head.

    Each sum is divided by its expected count (ZINC: 23.17 nodes, 49.86 + 23.17 existing, 2 * 6 * 23.17 added),
    the three are concatenated into ``z`` ``[B, 3D]``, and ``y = W_2 [u * mish(g) || z]`` with ``[u, g] = W_1 z``.

    Args:
        dim: State width ``D``.
        hidden_dim: GLU width.
        out_dim: Outputs per graph.
        expected_nodes, expected_edges, expected_added: Normalisers of the three sums.
    """

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        out_dim: int = 1,
        expected_nodes: float = 23.17,
        expected_edges: float = 73.03,
        expected_added: float = 278.04,
    ) -> None:
        super().__init__()
        for name, v in (
            ("expected_nodes", expected_nodes),
            ("expected_edges", expected_edges),
            ("expected_added", expected_added),
        ):
            if v <= 0:
                raise ConfigError(f"model.{name}={v} must be > 0")
        self.scales = (1.0 / expected_nodes, 1.0 / expected_edges, 1.0 / expected_added)
        self.glu = nn.Linear(3 * dim, 2 * hidden_dim)
        self.out = nn.Linear(hidden_dim + 3 * dim, out_dim)

    def forward(
        self, x: Tensor, e: Tensor, node_batch: Tensor, edge_batch: Tensor, added: Tensor, num_graphs: int
    ) -> Tensor:
        """Args: ``x`` ``[N, D]``, ``e`` ``[E, D]``, graph ids ``[N]``/``[E]``, ``added`` ``[E]`` bool. ``[B, out]``."""
        pooled_nodes = scatter(x, node_batch, 0, dim_size=num_graphs, reduce="sum") * self.scales[0]
        pooled_edges = scatter(e[~added], edge_batch[~added], 0, dim_size=num_graphs, reduce="sum") * self.scales[1]
        pooled_added = scatter(e[added], edge_batch[added], 0, dim_size=num_graphs, reduce="sum") * self.scales[2]
        z = torch.cat([pooled_nodes, pooled_edges, pooled_added], -1)
        u, g = self.glu(z).chunk(2, -1)
        return self.out(torch.cat([u * F.mish(g), z], -1))


class GrassNet(nn.Module):
    """The GRASS network for graph regression on typed graphs (molecules).

    Args:
        num_layers: Number of GRASS layers.
        dim: State width ``D``.
        hidden_dim: Attention width ``H``.
        num_node_types: Atom vocabulary size (ZINC: 28).
        num_edge_types: Bond vocabulary size (ZINC: 4, id 0 unused); self-loops get id ``num_edge_types`` and added
            edges ``num_edge_types + 1``.
        encoding: ``rrwp``, ``drrwp`` or ``none``.
        encoding_steps: ``K`` (RRWP) or ``S`` (D-RRWP).
        num_components: ``C`` of D-RRWP.
        degree_encoding: Concatenate (out, in) degree to the node encoding.
        added_edges_per_node: ``k`` of the random regular rewiring (0 disables rewiring).
        official_rewiring: Deduplicate before symmetrising, as the official code.
        edge_removal_rate, residual_scale: See :class:`GRASSLayer`.
        alternate_edge_direction: Swap heads and tails every second layer.
        add_self_loops: Add a self-loop to every node (own edge type).
        expected_nodes, expected_edges, expected_added: Pooling normalisers (see :class:`PoolingHead`).
        output_scale: Multiplies the prediction (2 on ZINC).
    """

    def __init__(
        self,
        num_layers: int = 8,
        dim: int = 32,
        hidden_dim: int = 32,
        num_node_types: int = 28,
        num_edge_types: int = 4,
        encoding: str = "rrwp",
        encoding_steps: int = 16,
        num_components: int = 16,
        degree_encoding: bool = True,
        added_edges_per_node: int = 6,
        official_rewiring: bool = False,
        edge_removal_rate: float = 0.1,
        residual_scale: float = 0.2,
        alternate_edge_direction: bool = True,
        add_self_loops: bool = True,
        expected_nodes: float = 23.17,
        expected_edges: float = 73.03,
        expected_added: float = 278.04,
        output_scale: float = 2.0,
    ) -> None:
        super().__init__()
        if encoding not in ENCODINGS:
            raise ConfigError(f"model.net.encoding={encoding!r} must be one of {list(ENCODINGS)}")
        if num_layers < 1:
            raise ConfigError(f"model.net.num_layers={num_layers} must be >= 1")
        if encoding != "none" and encoding_steps < 1:
            raise ConfigError(f"model.net.encoding_steps={encoding_steps} must be >= 1")
        if encoding == "drrwp" and num_components < 1:
            raise ConfigError(f"model.net.num_components={num_components} must be >= 1")
        if added_edges_per_node < 0:
            raise ConfigError(f"model.net.added_edges_per_node={added_edges_per_node} must be >= 0")
        self.encoding, self.steps, self.num_components = encoding, encoding_steps, num_components
        self.degree_encoding, self.k, self.official_rewiring = degree_encoding, added_edges_per_node, official_rewiring
        self.alternate, self.add_self_loops, self.output_scale = alternate_edge_direction, add_self_loops, output_scale
        self.num_edge_types = num_edge_types
        self.generator: torch.Generator | None = None
        self.node_emb = nn.Embedding(num_node_types, dim)
        self.edge_emb = nn.Embedding(num_edge_types + 2, dim)
        node_enc = (encoding_steps if encoding != "none" else 0) + (2 if degree_encoding else 0)
        edge_enc = {"rrwp": 2 * encoding_steps, "drrwp": encoding_steps, "none": 0}[encoding]
        self.node_enc = nn.Sequential(RunningNorm(node_enc), nn.Linear(node_enc, dim)) if node_enc else None
        self.edge_enc = nn.Sequential(RunningNorm(edge_enc), nn.Linear(edge_enc, dim)) if edge_enc else None
        self.layers = nn.ModuleList(
            GRASSLayer(dim, hidden_dim, edge_removal_rate, residual_scale) for _ in range(num_layers)
        )
        self.head = PoolingHead(dim, hidden_dim, 1, expected_nodes, expected_edges, expected_added)

    @contextmanager
    def collecting_statistics(self) -> Iterator[None]:
        """Train-mode batch norms with random edge removal off (re-collection of BN statistics before testing)."""
        for layer in self.layers:
            layer.removal_active = False
        try:
            yield
        finally:
            for layer in self.layers:
                layer.removal_active = True

    def build_edges(self, edge_index: Tensor, edge_attr: Tensor, batch: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Original edges + self-loops + a fresh random regular graph. Returns ``(edge_index, type, added)``."""
        n = batch.numel()
        parts, types = [edge_index], [edge_attr.view(-1).long()]
        if self.add_self_loops:
            loops = torch.arange(n, device=batch.device)
            parts.append(torch.stack([loops, loops]))
            types.append(torch.full((n,), self.num_edge_types, dtype=torch.long, device=batch.device))
        n_existing = sum(p.shape[1] for p in parts)
        if self.k > 0:
            new = batched_random_regular_edges(batch, self.k, self.generator, self.official_rewiring)
            parts.append(new)
            types.append(torch.full((new.shape[1],), self.num_edge_types + 1, dtype=torch.long, device=batch.device))
        ei = torch.cat(parts, 1)
        added = torch.arange(ei.shape[1], device=ei.device) >= n_existing
        return ei, torch.cat(types), added

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor) -> Tensor:
        """Args: atom types ``x`` ``[N]``/``[N, 1]``, ``edge_index`` ``[2, E]``, bond types ``[E]``, ``batch`` ``[N]``.

        Returns:
            ``[B]`` predictions.
        """
        num_graphs = int(batch.max()) + 1
        ei, etype, added = self.build_edges(edge_index, edge_attr, batch)
        h = self.node_emb(x.view(-1).long())
        e = self.edge_emb(etype)
        feats = []
        if self.encoding != "none":
            # Encodings of the original graph (before self-loops and rewiring); added edges also get P[h, t].
            if self.encoding == "rrwp":
                node_pe, table, local = batched_rrwp(edge_index, batch, self.steps, dtype=h.dtype)
            else:
                node_pe, table, local = batched_drrwp(edge_index, batch, self.num_components, self.steps, dtype=h.dtype)
            feats.append(node_pe)
            e = e + self.edge_enc(pair_encoding(table, batch, local, ei, reverse=self.encoding == "rrwp"))
        if self.degree_encoding:
            n = batch.numel()
            feats += [degree(edge_index[0], n)[:, None], degree(edge_index[1], n)[:, None]]
        if feats:
            h = h + self.node_enc(torch.cat(feats, -1).to(h.dtype))
        cur = ei
        for layer in self.layers:
            h, e = layer(h, e, cur)
            if self.alternate:
                cur = cur.flip(0)
        out = self.head(h, e, batch, batch[ei[0]], added, num_graphs)
        return self.output_scale * out.squeeze(-1)
