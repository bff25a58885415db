"""RRWP, D-RRWP and random regular rewiring: per-graph transforms, batched fast paths and dense oracles."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.utils import coalesce, degree, to_undirected

from core.errors import ConfigError
from layers.graph.grass_encodings import (
    AddDRRWP,
    AddRandomRegularEdges,
    AddRRWP,
    batched_drrwp,
    batched_random_regular_edges,
    batched_rrwp,
    drrwp_dense_reference,
    drrwp_eigenpairs,
    drrwp_from_eigenpairs,
    pair_encoding,
    random_regular_edges,
    rrwp,
    rrwp_dense_reference,
)


def path(n: int) -> torch.Tensor:
    return to_undirected(torch.stack([torch.arange(n - 1), torch.arange(1, n)]))


def star(n: int) -> torch.Tensor:
    return to_undirected(torch.stack([torch.zeros(n - 1, dtype=torch.long), torch.arange(1, n)]))


def molecule_like() -> torch.Tensor:
    """A 6-ring with a 3-atom tail and a separate 2-node component (disconnected, irregular degrees)."""
    ring = [(i, (i + 1) % 6) for i in range(6)]
    tail = [(2, 6), (6, 7), (7, 8), (9, 10)]
    return to_undirected(torch.tensor(ring + tail).t())


def graphs() -> list[tuple[torch.Tensor, int]]:
    return [(path(5), 5), (star(6), 6), (molecule_like(), 11), (torch.zeros(2, 0, dtype=torch.long), 1)]


# -- RRWP ------------------------------------------------------------------------------------------------------------


def test_rrwp_dense_reference_is_matrix_power_of_random_walk():
    ei, n = path(4), 4
    node, p = rrwp_dense_reference(ei, n, 3)
    a = torch.zeros(4, 4, dtype=torch.float64)
    a[ei[0], ei[1]] = 1
    t = a / a.sum(1, keepdim=True)
    torch.testing.assert_close(p[..., 2], t @ t @ t, rtol=0, atol=1e-15)
    # Row-stochastic: every power of T sums to 1 over the tail.
    torch.testing.assert_close(p.sum(1), torch.ones(4, 3, dtype=torch.float64), rtol=0, atol=1e-12)
    # No identity term (unlike GRIT): P_1 has a zero diagonal on a graph without self-loops.
    assert node[:, 0].abs().max() == 0


@pytest.mark.parametrize("steps", [1, 4, 20])  # 20 > N: K larger than N is allowed
def test_rrwp_sparse_matches_dense(steps: int):
    for ei, n in graphs():
        node, p = rrwp(ei, n, steps, dtype=torch.float64)
        node_ref, p_ref = rrwp_dense_reference(ei, n, steps)
        torch.testing.assert_close(p, p_ref, rtol=0, atol=1e-12)
        torch.testing.assert_close(node, node_ref, rtol=0, atol=1e-12)


def test_rrwp_single_node_and_bad_steps():
    node, p = rrwp(torch.zeros(2, 0, dtype=torch.long), 1, 3)
    assert node.shape == (1, 3) and p.shape == (1, 1, 3) and p.abs().sum() == 0
    with pytest.raises(ConfigError, match="K"):
        rrwp(path(3), 3, 0)


def test_batched_rrwp_matches_per_graph_oracle():
    data = [Data(edge_index=ei, num_nodes=n) for ei, n in graphs()]
    b = Batch.from_data_list(data)
    node, table, local = batched_rrwp(b.edge_index, b.batch, 7, dtype=torch.float64)
    ref_nodes, ref_pairs = [], []
    for ei, n in graphs():
        nd, p = rrwp_dense_reference(ei, n, 7)
        ref_nodes.append(nd)
        h, t = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        ref_pairs.append(torch.cat([p[h.flatten(), t.flatten()], p[t.flatten(), h.flatten()]], -1))
    torch.testing.assert_close(node, torch.cat(ref_nodes), rtol=0, atol=1e-12)
    # All pairs inside every graph, through the same lookup the model uses for added edges.
    pairs = []
    for g in range(b.num_graphs):
        ids = (b.batch == g).nonzero().flatten()
        h, t = torch.meshgrid(ids, ids, indexing="ij")
        pairs.append(pair_encoding(table, b.batch, local, torch.stack([h.flatten(), t.flatten()])))
    torch.testing.assert_close(torch.cat(pairs), torch.cat(ref_pairs), rtol=0, atol=1e-12)


def test_add_rrwp_transform_stores_node_and_both_directions():
    ei = molecule_like()
    data = AddRRWP(steps=5)(Data(edge_index=ei, num_nodes=11))
    node, p = rrwp_dense_reference(ei, 11, 5)
    assert data.rrwp_node.shape == (11, 5) and data.rrwp_edge.shape == (ei.shape[1], 10)
    torch.testing.assert_close(data.rrwp_node.double(), node, rtol=0, atol=1e-6)
    torch.testing.assert_close(data.rrwp_edge[:, :5].double(), p[ei[0], ei[1]], rtol=0, atol=1e-6)
    torch.testing.assert_close(data.rrwp_edge[:, 5:].double(), p[ei[1], ei[0]], rtol=0, atol=1e-6)
    # Irregular degrees make P asymmetric, so the reverse half carries information.
    assert (data.rrwp_edge[:, :5] - data.rrwp_edge[:, 5:]).abs().max() > 0.05


# -- D-RRWP ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make,n", [(path, 5), (star, 6), (path, 7)])
def test_drrwp_full_rank_equals_dense_powers_of_S(make, n: int):
    """C = N - 1 drops one eigenvalue; on these graphs (singular adjacency) it is 0, so the estimate is exact."""
    ei = make(n)
    lam, u = drrwp_eigenpairs(ei, n, num_components=64)
    assert lam.numel() == n - 1
    idx = torch.arange(n)
    h, t = torch.meshgrid(idx, idx, indexing="ij")
    est = drrwp_from_eigenpairs(lam, u, 6, h.flatten(), t.flatten()).view(n, n, 6)
    node_ref, pairs_ref = drrwp_dense_reference(ei, n, 6)
    torch.testing.assert_close(est, pairs_ref, rtol=0, atol=1e-10)
    # Its diagonal equals diag(T^s) of RRWP exactly; the off-diagonals of S^s and T^s differ by sqrt(d_j / d_i).
    rw_node, rw_pairs = rrwp_dense_reference(ei, n, 6)
    torch.testing.assert_close(node_ref, rw_node, rtol=0, atol=1e-12)
    d = degree(ei[0], n, dtype=torch.float64)
    torch.testing.assert_close(rw_pairs, pairs_ref * (d[None, :] / d[:, None]).sqrt()[..., None], rtol=0, atol=1e-12)


def test_drrwp_truncation_keeps_largest_magnitudes():
    ei, n = path(7), 7
    lam, u = drrwp_eigenpairs(ei, n, num_components=2)
    # A path is bipartite: the two largest magnitudes are +1 and -1.
    torch.testing.assert_close(lam.abs(), torch.ones(2, dtype=torch.float64), rtol=0, atol=1e-12)
    idx = torch.arange(n)
    node = drrwp_from_eigenpairs(lam, u, 3, idx, idx)
    full, _ = drrwp_dense_reference(ei, n, 3)
    assert (node - full).abs().max() > 1e-3  # truncation is an approximation


def test_batched_drrwp_matches_per_graph():
    cases = [(path(5), 5), (star(6), 6), (path(7), 7), (torch.zeros(2, 0, dtype=torch.long), 1)]
    b = Batch.from_data_list([Data(edge_index=ei, num_nodes=n) for ei, n in cases])
    for c in (2, 64):
        node, table, local = batched_drrwp(b.edge_index, b.batch, c, 4, dtype=torch.float64)
        offset = 0
        for ei, n in cases:
            lam, u = drrwp_eigenpairs(ei, n, c)
            idx = torch.arange(n)
            h, t = torch.meshgrid(idx, idx, indexing="ij")
            ref = drrwp_from_eigenpairs(lam, u, 4, h.flatten(), t.flatten())
            g = int(b.batch[offset])
            torch.testing.assert_close(table[g, :n, :n].reshape(-1, 4), ref, rtol=0, atol=1e-10)
            torch.testing.assert_close(node[offset : offset + n], ref.view(n, n, 4)[idx, idx], rtol=0, atol=1e-10)
            offset += n


def test_add_drrwp_transform_single_node_and_config():
    data = AddDRRWP(num_components=8, steps=3)(Data(edge_index=torch.zeros(2, 0, dtype=torch.long), num_nodes=1))
    assert data.drrwp_node.shape == (1, 3) and data.drrwp_node.abs().sum() == 0
    data = AddDRRWP(num_components=8)(Data(edge_index=path(5), num_nodes=5))
    rw_node, _ = rrwp_dense_reference(path(5), 5, 8)
    torch.testing.assert_close(data.drrwp_node.double(), rw_node, rtol=0, atol=1e-6)
    with pytest.raises(ConfigError, match="num_components"):
        AddDRRWP(num_components=0)


# -- rewiring --------------------------------------------------------------------------------------------------------


def test_random_regular_edges_structure():
    g = torch.Generator().manual_seed(0)
    n, k = 40, 6
    ei = random_regular_edges(n, k, g)
    assert (ei[0] != ei[1]).all(), "self-loops must be dropped"
    assert coalesce(ei).shape == ei.shape, "paper mode has no duplicate arcs"
    assert torch.equal(coalesce(ei), coalesce(ei.flip(0))), "must be symmetric"
    deg = degree(ei[0], n)
    assert deg.max() <= 2 * k and deg.float().mean() > 1.6 * k  # approximately 2k-regular


def test_official_rewiring_dedups_before_reversing():
    n, k = 30, 6
    off = random_regular_edges(n, k, torch.Generator().manual_seed(3), official=True)
    paper = random_regular_edges(n, k, torch.Generator().manual_seed(3), official=False)
    fwd = off[:, : off.shape[1] // 2]
    # Forward half: a union of k permutations, so every node has out- and in-degree <= k (k N arcs before dedup).
    assert degree(fwd[0], n).max() <= k and degree(fwd[1], n).max() <= k
    assert torch.equal(off[:, off.shape[1] // 2 :], fwd.flip(0))
    # Same permutations: the paper's simple graph is the official multigraph without duplicates.
    assert torch.equal(coalesce(off), paper)
    assert off.shape[1] > paper.shape[1], "the official order keeps duplicate arcs"


def test_rewiring_small_graphs_and_bad_k():
    assert random_regular_edges(1, 6).shape == (2, 0)
    two = random_regular_edges(2, 6, torch.Generator().manual_seed(1))  # k clamped to N - 1 = 1
    assert two.shape[1] in (0, 2)
    with pytest.raises(ConfigError, match="added_edges_per_node"):
        random_regular_edges(5, -1)


def test_batched_rewiring_matches_per_graph_permutations():
    sizes = [1, 2, 5, 9]
    batch = torch.repeat_interleave(torch.arange(4), torch.tensor(sizes))
    k = 3
    keys = torch.rand(k, batch.numel(), generator=torch.Generator().manual_seed(0))
    out = batched_random_regular_edges(batch, k, keys=keys)
    ref, offset = [], 0
    for n in sizes:
        kk = min(n - 1, k)
        heads = torch.arange(n).repeat(kk)
        tails = torch.cat([torch.argsort(keys[r, offset : offset + n]) for r in range(kk)]) if kk else heads
        keep = heads != tails
        arcs = torch.stack([heads[keep], tails[keep]]) + offset
        ref.append(torch.cat([arcs, arcs.flip(0)], 1))
        offset += n
    assert torch.equal(out, coalesce(torch.cat(ref, 1)))
    assert (batch[out[0]] == batch[out[1]]).all(), "added edges stay inside their graph"


def test_add_random_regular_edges_transform():
    data = Data(edge_index=path(8), edge_attr=torch.ones(14, dtype=torch.long), num_nodes=8)
    out = AddRandomRegularEdges(added_edges_per_node=2, added_edge_type=5, seed=0)(data)
    added = out.added_edge_mask
    assert added[:14].sum() == 0 and added[14:].all() and added.sum() > 0
    assert (out.edge_attr[added] == 5).all() and (out.edge_attr[~added] == 1).all()
    with pytest.raises(ConfigError):
        AddRandomRegularEdges(added_edges_per_node=-2)
