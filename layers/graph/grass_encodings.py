"""GRASS structural encodings and stochastic rewiring (Sec. 3 of the GRASS paper, ICLR 2025).

Three components, each as a per-graph PyG ``BaseTransform`` (the readable reference), a batched fast path used by
the model on whole mini-batches, and a dense oracle used in the parity tests:

* **RRWP** (relative random-walk probabilities): ``T = D^{-1} A`` with ``D`` the out-degree clamped to >= 1 and
  ``P_k = T^k`` for ``k = 1..K`` (no identity term, unlike GRIT). Node encoding ``diag(P_k)`` ``[N, K]``; the
  encoding of an edge ``(h, t)`` is ``[P_k[h, t] || P_k[t, h]]`` ``[2K]`` (Eq. (1)-(2)).
* **D-RRWP** (decomposed RRWP): the top-``C`` eigenpairs ``(lambda_c, U_c)`` by magnitude of the symmetric
  normalised adjacency ``S = D^{-1/2} A D^{-1/2}``, ``C = min(N - 1, num_components)``; pair encoding
  ``sum_c U_ic U_jc lambda_c^s`` for ``s = 1..S`` (a truncated estimate of ``S^s``) and node encoding
  ``sum_c U_ic^2 lambda_c^s``. ``diag(S^s) = diag(T^s)`` exactly, the off-diagonals differ by ``sqrt(d_j / d_i)``.
* **Random regular rewiring**: a union of ``k = min(N - 1, added_edges_per_node)`` random permutation digraphs
  (heads ``0..N-1`` repeated ``k`` times, tails the concatenation of ``k`` independent permutations), self-loops
  dropped, plus reverse edges: the paper's "superimposed random regular graph". The default (``official=False``)
  symmetrises first and then removes duplicates, giving a simple undirected graph of degree <= 2k. The official
  code runs ``unique`` *before* adding the reverse copies, so (a, b) may appear twice; ``official=True`` keeps that.

Edges go head ``h`` -> tail ``t`` (``edge_index[0]`` -> ``edge_index[1]``). Nothing here imports Lightning.
Equation numbers follow the numbered list in ``docs/methods/grass.md`` (the paper's numbering was not available).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse
import scipy.sparse.linalg
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform
from torch_geometric.utils import coalesce, degree, to_dense_adj, to_dense_batch

from core.errors import ConfigError

# -- helpers ---------------------------------------------------------------------------------------------------------


def _check_positive(name: str, value: int, minimum: int = 1) -> None:
    if int(value) < minimum:
        raise ConfigError(f"{name}={value} must be >= {minimum}")


def dense_adjacency(edge_index: Tensor, num_nodes: int, dtype: torch.dtype = torch.float64) -> Tensor:
    """Dense 0/1 adjacency ``A[h, t] = 1`` for each edge (duplicates count once). Shape ``[N, N]``."""
    a = torch.zeros(num_nodes, num_nodes, dtype=dtype)
    if edge_index.numel():
        a[edge_index[0], edge_index[1]] = 1.0
    return a


# -- RRWP ------------------------------------------------------------------------------------------------------------


def rrwp_dense_reference(edge_index: Tensor, num_nodes: int, steps: int) -> tuple[Tensor, Tensor]:
    """Oracle: ``P_k = T^k`` by dense matrix powers in float64 (Eq. (1)).

    Returns:
        ``(node [N, K], P [N, N, K])`` with ``node[:, k-1] = diag(T^k)``.
    """
    a = dense_adjacency(edge_index, num_nodes)
    t = a / a.sum(1, keepdim=True).clamp(min=1.0)
    mats, cur = [], torch.eye(num_nodes, dtype=a.dtype)
    for _ in range(steps):
        cur = cur @ t
        mats.append(cur)
    p = torch.stack(mats, -1) if mats else a.new_zeros(num_nodes, num_nodes, 0)
    return torch.diagonal(p, dim1=0, dim2=1).T.contiguous(), p


def rrwp(edge_index: Tensor, num_nodes: int, steps: int, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """RRWP of one graph with sparse products ``P_k = P_{k-1} T`` (what :class:`AddRRWP` stores).

    Args:
        edge_index: ``[2, E]`` head -> tail; duplicate edges are merged.
        num_nodes: ``N``.
        steps: ``K >= 1`` (may exceed ``N``).
        dtype: Computation dtype.

    Returns:
        ``(node [N, K], P [N, N, K])``.
    """
    _check_positive("rrwp steps (K)", steps)
    ei = coalesce(edge_index, num_nodes=num_nodes) if edge_index.numel() else edge_index
    deg = degree(ei[0], num_nodes, dtype=dtype).clamp(min=1.0)
    w = 1.0 / deg[ei[0]]
    t = torch.sparse_coo_tensor(ei, w, (num_nodes, num_nodes), check_invariants=True).coalesce()
    cur = t.to_dense()
    mats = [cur]
    for _ in range(steps - 1):
        # P_k = P_{k-1} T, i.e. (T^T P_{k-1}^T)^T, with the sparse factor on the left.
        cur = torch.sparse.mm(t.t(), cur.t()).t()
        mats.append(cur)
    p = torch.stack(mats, -1)
    return torch.diagonal(p, dim1=0, dim2=1).T.contiguous(), p


def batched_rrwp(
    edge_index: Tensor, batch: Tensor, steps: int, dtype: torch.dtype | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Fast path: RRWP of every graph of a mini-batch with batched dense products ``[B, Nmax, Nmax]``.

    Args:
        edge_index: ``[2, E]`` of the batched (block-diagonal) graph.
        batch: ``[N]`` graph id of each node.
        steps: ``K``.
        dtype: Computation dtype (default: the default dtype).

    Returns:
        ``(node [N, K], P [B, Nmax, Nmax, K], local [N])``: ``local`` is each node's index inside its graph, so the
        pair encoding of nodes ``i, j`` of graph ``b`` is ``P[b, local[i], local[j]]``.
    """
    _check_positive("rrwp steps (K)", steps)
    num_graphs = int(batch.max()) + 1 if batch.numel() else 0
    a = to_dense_adj(edge_index, batch, batch_size=num_graphs).clamp(max=1.0)  # [B, Nmax, Nmax]
    a = a.to(dtype or torch.get_default_dtype())
    t = a / a.sum(-1, keepdim=True).clamp(min=1.0)
    mats, cur = [t], t
    for _ in range(steps - 1):
        cur = torch.bmm(cur, t)
        mats.append(cur)
    p = torch.stack(mats, -1)  # [B, Nmax, Nmax, K]
    _, mask = to_dense_batch(batch, batch, batch_size=num_graphs)
    local = torch.arange(batch.numel(), device=batch.device) - _ptr(batch, num_graphs)[batch]
    diag = torch.diagonal(p, dim1=1, dim2=2)  # [B, K, Nmax]
    node = diag.transpose(1, 2)[mask]
    return node, p, local


def _ptr(batch: Tensor, num_graphs: int) -> Tensor:
    counts = torch.bincount(batch, minlength=num_graphs)
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)[:-1]])


def pair_encoding(p: Tensor, batch: Tensor, local: Tensor, edge_index: Tensor, reverse: bool = True) -> Tensor:
    """``[P[h, t] || P[t, h]]`` (or ``P[h, t]`` when ``reverse=False``) for each edge, from a batched table.

    Args:
        p: ``[B, Nmax, Nmax, K]`` from :func:`batched_rrwp` or :func:`batched_drrwp`.
        batch, local: ``[N]`` graph id and in-graph index of each node.
        edge_index: ``[2, E]`` edges inside graphs (any, including added ones).

    Returns:
        ``[E, 2K]`` (or ``[E, K]``).
    """
    h, t = edge_index
    g = batch[h]
    fwd = p[g, local[h], local[t]]
    return torch.cat([fwd, p[g, local[t], local[h]]], -1) if reverse else fwd


class AddRRWP(BaseTransform):
    """Per-graph RRWP transform (reference; the model uses :func:`batched_rrwp` on whole batches).

    Stores ``data.rrwp_node`` ``[N, K]`` and ``data.rrwp_edge`` ``[E, 2K]`` (``[P[h,t] || P[t,h]]`` per edge),
    computed on the graph as given (the paper: before self-loops and rewiring).

    Args:
        steps: ``K >= 1``.
    """

    def __init__(self, steps: int = 32) -> None:
        _check_positive("rrwp steps (K)", steps)
        self.steps = steps

    def forward(self, data: Data) -> Data:
        node, p = rrwp(data.edge_index, data.num_nodes, self.steps)
        h, t = data.edge_index
        data.rrwp_node = node
        data.rrwp_edge = torch.cat([p[h, t], p[t, h]], -1)
        return data


# -- D-RRWP ----------------------------------------------------------------------------------------------------------


def sym_norm_adjacency_dense(edge_index: Tensor, num_nodes: int) -> Tensor:
    """``S = D^{-1/2} A D^{-1/2}`` (float64, ``D`` the degree clamped to >= 1). Shape ``[N, N]``."""
    a = dense_adjacency(edge_index, num_nodes)
    d = a.sum(1).clamp(min=1.0).rsqrt()
    return d[:, None] * a * d[None, :]


def drrwp_dense_reference(edge_index: Tensor, num_nodes: int, steps: int) -> tuple[Tensor, Tensor]:
    """Oracle: dense powers ``S^s`` for ``s = 1..S`` in float64 (what D-RRWP estimates; Eq. (3)).

    Returns:
        ``(node [N, S], pairs [N, N, S])``.
    """
    s = sym_norm_adjacency_dense(edge_index, num_nodes)
    mats, cur = [], torch.eye(num_nodes, dtype=s.dtype)
    for _ in range(steps):
        cur = cur @ s
        mats.append(cur)
    p = torch.stack(mats, -1)
    return torch.diagonal(p, dim1=0, dim2=1).T.contiguous(), p


def drrwp_eigenpairs(edge_index: Tensor, num_nodes: int, num_components: int) -> tuple[Tensor, Tensor]:
    """Top-``C`` eigenpairs of ``S`` by magnitude, ``C = min(N - 1, num_components)`` (the official convention).

    Small graphs use a dense ``eigh``; larger ones ``scipy.sparse.linalg.eigsh(which="LM")`` as the official code.

    Returns:
        ``(lam [C], U [N, C])`` in float64.
    """
    _check_positive("drrwp num_components (C)", num_components)
    c = min(num_nodes - 1, num_components)
    if c <= 0:
        return torch.zeros(0, dtype=torch.float64), torch.zeros(num_nodes, 0, dtype=torch.float64)
    if num_nodes <= 256 or c >= num_nodes - 1:
        lam, u = torch.linalg.eigh(sym_norm_adjacency_dense(edge_index, num_nodes))
        order = torch.argsort(lam.abs(), descending=True, stable=True)[:c]
        return lam[order], u[:, order]
    a = scipy.sparse.coo_matrix(
        (np.ones(edge_index.shape[1]), edge_index.numpy()), shape=(num_nodes, num_nodes)
    ).tocsr()
    a.data[:] = 1.0
    d = np.asarray(a.sum(1)).ravel().clip(min=1.0) ** -0.5
    s = scipy.sparse.diags(d) @ a @ scipy.sparse.diags(d)
    lam, u = scipy.sparse.linalg.eigsh(s, k=c, which="LM")
    return torch.from_numpy(lam), torch.from_numpy(u)


def drrwp_from_eigenpairs(lam: Tensor, u: Tensor, steps: int, rows: Tensor, cols: Tensor) -> Tensor:
    """``sum_c U[i, c] U[j, c] lambda_c^s`` for pairs ``(rows, cols)``, ``s = 1..S`` (Eq. (3)). Shape ``[P, S]``."""
    powers = lam[:, None] ** torch.arange(1, steps + 1, dtype=lam.dtype, device=lam.device)[None, :]  # [C, S]
    return (u[rows] * u[cols]) @ powers


class AddDRRWP(BaseTransform):
    """Per-graph D-RRWP transform: ``data.drrwp_node`` ``[N, S]`` and ``data.drrwp_edge`` ``[E, S]``.

    Args:
        num_components: Maximum number of eigenpairs ``C`` (clamped to ``N - 1``).
        steps: ``S``; ``None`` uses ``num_components`` as the official code.
    """

    def __init__(self, num_components: int = 32, steps: int | None = None) -> None:
        _check_positive("drrwp num_components (C)", num_components)
        self.num_components = num_components
        self.steps = num_components if steps is None else steps
        _check_positive("drrwp steps (S)", self.steps)

    def forward(self, data: Data) -> Data:
        n = data.num_nodes
        lam, u = drrwp_eigenpairs(data.edge_index, n, self.num_components)
        idx = torch.arange(n)
        data.drrwp_node = drrwp_from_eigenpairs(lam, u, self.steps, idx, idx).float()
        data.drrwp_edge = drrwp_from_eigenpairs(lam, u, self.steps, data.edge_index[0], data.edge_index[1]).float()
        return data


def batched_drrwp(
    edge_index: Tensor, batch: Tensor, num_components: int, steps: int, dtype: torch.dtype | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Fast path: D-RRWP of a whole batch with one batched ``eigh`` of the padded ``S`` matrices.

    Padding rows are zero, so they only add zero eigenvalues (which contribute nothing for ``s >= 1``). Per graph the
    ``C_b = min(N_b - 1, num_components)`` eigenvalues of largest magnitude are kept.

    Returns:
        ``(node [N, S], table [B, Nmax, Nmax, S], local [N])`` as :func:`batched_rrwp`.
    """
    _check_positive("drrwp num_components (C)", num_components)
    _check_positive("drrwp steps (S)", steps)
    num_graphs = int(batch.max()) + 1 if batch.numel() else 0
    a = to_dense_adj(edge_index, batch, batch_size=num_graphs).clamp(max=1.0).double()
    d = a.sum(-1).clamp(min=1.0).rsqrt()
    s = d[:, :, None] * a * d[:, None, :]
    lam, u = torch.linalg.eigh(s)  # [B, M], [B, M, M]
    rank = torch.argsort(
        torch.argsort(lam.abs(), dim=-1, descending=True, stable=True), dim=-1
    )  # rank of each eigenvalue by |lambda|
    sizes = torch.bincount(batch, minlength=num_graphs)
    keep = rank < (sizes - 1).clamp(min=0).clamp(max=num_components)[:, None]
    powers = lam[..., None] ** torch.arange(1, steps + 1, dtype=lam.dtype, device=lam.device)  # [B, M, S]
    powers = powers * keep[..., None]
    table = torch.einsum("bic,bjc,bcs->bijs", u, u, powers).to(dtype or torch.get_default_dtype())
    local = torch.arange(batch.numel(), device=batch.device) - _ptr(batch, num_graphs)[batch]
    node = table[batch, local, local]
    return node, table, local


# -- random regular rewiring -----------------------------------------------------------------------------------------


def _rewire_from_arcs(heads: Tensor, tails: Tensor, num_nodes: int, official: bool) -> Tensor:
    keep = heads != tails  # self-loops of the permutations are dropped
    arcs = torch.stack([heads[keep], tails[keep]])
    if official:
        # Official order: unique first, then append the reversed copies (duplicates may survive).
        arcs = torch.unique(arcs, dim=1)
        return torch.cat([arcs, arcs.flip(0)], 1)
    return coalesce(torch.cat([arcs, arcs.flip(0)], 1), num_nodes=num_nodes)


def random_regular_edges(
    num_nodes: int, k: int, generator: torch.Generator | None = None, official: bool = False
) -> Tensor:
    """Random edges of one graph (Eq. (10)): the union of ``min(N-1, k)`` random permutation digraphs + reverse edges.

    Before self-loop removal there are exactly ``k N`` arcs and every node has out- and in-degree ``k``.

    Args:
        num_nodes: ``N``.
        k: Added edges per node (``num_added_edges_per_node``), ``>= 0``.
        generator: Source of randomness.
        official: Deduplicate before adding reverse edges (the official code) instead of after (the paper).

    Returns:
        ``[2, M]`` symmetric edge index without self-loops.
    """
    if k < 0:
        raise ConfigError(f"added_edges_per_node={k} must be >= 0")
    k = min(num_nodes - 1, k)
    if k <= 0:
        return torch.zeros(2, 0, dtype=torch.long)
    heads = torch.arange(num_nodes).repeat(k)
    tails = torch.cat([torch.randperm(num_nodes, generator=generator) for _ in range(k)])
    return _rewire_from_arcs(heads, tails, num_nodes, official)


def batched_random_regular_edges(
    batch: Tensor, k: int, generator: torch.Generator | None = None, official: bool = False, keys: Tensor | None = None
) -> Tensor:
    """Fast path: random regular rewiring of every graph of a batch at once (no Python loop over graphs).

    Round ``r`` draws one uniform key per node and sorts by ``graph id + key``: that is an independent uniform
    permutation of each graph's nodes. Graph ``b`` uses rounds ``r < min(N_b - 1, k)``.

    Args:
        batch: ``[N]`` sorted graph id of each node.
        k: Added edges per node.
        generator: Source of randomness.
        official: See :func:`random_regular_edges`.
        keys: ``[k, N]`` keys in ``[0, 1)`` to use instead of drawing them (parity tests).

    Returns:
        ``[2, M]`` edge index (global node ids), symmetric, without self-loops, inside graphs only.
    """
    if k < 0:
        raise ConfigError(f"added_edges_per_node={k} must be >= 0")
    n = batch.numel()
    if k == 0 or n == 0:
        return torch.zeros(2, 0, dtype=torch.long, device=batch.device)
    if keys is None:
        keys = torch.rand(k, n, generator=generator, device=batch.device if generator is None else generator.device)
        keys = keys.to(batch.device)
    sizes = torch.bincount(batch)
    k_node = (sizes - 1).clamp(min=0, max=k)[batch]  # [N]
    order = torch.argsort(batch.to(keys.dtype)[None, :] + keys, dim=1)  # [k, N]: per-graph permutations
    heads = torch.arange(n, device=batch.device).expand(k, n)
    rounds = torch.arange(k, device=batch.device)[:, None]
    use = rounds < k_node[None, :]
    return _rewire_from_arcs(heads[use], order[use], n, official)


class AddRandomRegularEdges(BaseTransform):
    """Per-graph rewiring transform, meant as the *per-access* ``transform`` (resampled every epoch and at test).

    Appends the random edges to ``edge_index``, gives them edge type ``added_edge_type`` in ``edge_attr`` and sets
    ``data.added_edge_mask`` ``[E']``.

    Args:
        added_edges_per_node: ``k`` (6 on ZINC).
        added_edge_type: Edge-type id of added edges.
        official: See :func:`random_regular_edges`.
        seed: Seed of this transform's own generator (``None``: global RNG).
    """

    def __init__(
        self, added_edges_per_node: int = 6, added_edge_type: int = 5, official: bool = False, seed: int | None = None
    ) -> None:
        if added_edges_per_node < 0:
            raise ConfigError(f"added_edges_per_node={added_edges_per_node} must be >= 0")
        self.k, self.added_edge_type, self.official = added_edges_per_node, added_edge_type, official
        self.generator = torch.Generator().manual_seed(seed) if seed is not None else None

    def forward(self, data: Data) -> Data:
        new = random_regular_edges(data.num_nodes, self.k, self.generator, self.official)
        e0 = data.edge_index.shape[1]
        data.edge_index = torch.cat([data.edge_index, new], 1)
        if getattr(data, "edge_attr", None) is not None:
            fill = torch.full(
                (new.shape[1], *data.edge_attr.shape[1:]), self.added_edge_type, dtype=data.edge_attr.dtype
            )
            data.edge_attr = torch.cat([data.edge_attr, fill], 0)
        data.added_edge_mask = torch.cat(
            [torch.zeros(e0, dtype=torch.bool), torch.ones(new.shape[1], dtype=torch.bool)]
        )
        return data
