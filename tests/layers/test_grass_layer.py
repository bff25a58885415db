"""GRASS layer (MessagePassing) vs a dense per-tail softmax reference; pooling head; full network; baselines."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.utils import scatter, to_undirected

from core.errors import ConfigError
from layers.graph.grass import (
    GRASSLayer,
    GrassNet,
    NoAffineBatchNorm,
    PoolingHead,
    edge_removal,
    grass_layer_dense_reference,
)
from layers.graph.grass_baselines import GINENet, GPSNet, count_parameters


def random_graph(n: int, e: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n, (2, e), generator=g)


def molecule(n: int, seed: int) -> Data:
    """A chain with one ring closure: connected, irregular, with typed atoms and bonds."""
    g = torch.Generator().manual_seed(seed)
    pairs = [(i, i + 1) for i in range(n - 1)] + ([(0, min(5, n - 1))] if n > 6 else [])
    ei = to_undirected(torch.tensor(pairs, dtype=torch.long).t().reshape(2, -1), num_nodes=n)
    return Data(
        x=torch.randint(0, 28, (n, 1), generator=g),
        edge_index=ei,
        edge_attr=torch.randint(1, 4, (ei.shape[1],), generator=g),
        y=torch.randn(1, generator=g),
    )


def make_layer(norm: bool = True) -> GRASSLayer:
    torch.manual_seed(0)
    layer = GRASSLayer(6, 5, edge_removal_rate=0.3, residual_scale=0.2, norm=norm).double()
    with torch.no_grad():
        layer.beta_x.normal_()
        layer.beta_e.normal_()
    return layer


@pytest.mark.parametrize("norm", [True, False])
def test_grass_layer_matches_dense_reference_outputs_and_gradients(norm: bool):
    layer = make_layer(norm).eval()
    n, ei = 7, random_graph(7, 25, 1)  # duplicates and self-loops included; node 6 may have no incoming edge
    x = torch.randn(n, 6, dtype=torch.float64, requires_grad=True)
    e = 3 * torch.randn(ei.shape[1], 6, dtype=torch.float64, requires_grad=True)
    cx, ce = torch.randn(n, 6, dtype=torch.float64), torch.randn(ei.shape[1], 6, dtype=torch.float64)

    def run(fn):
        xo, eo = fn(x, e)
        loss = (xo * cx).sum() + (eo * ce).sum()
        grads = torch.autograd.grad(loss, [x, e, *layer.parameters()])
        return xo.detach(), eo.detach(), grads

    fast = run(lambda a, b: layer(a, b, ei))
    ref = run(lambda a, b: grass_layer_dense_reference(layer, a, b, ei))
    torch.testing.assert_close(fast[0], ref[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fast[1], ref[1], rtol=1e-12, atol=1e-12)
    for gf, gr in zip(fast[2], ref[2]):
        torch.testing.assert_close(gf, gr, rtol=1e-10, atol=1e-12)


def test_attention_weights_form_a_per_channel_softmax_over_incoming_edges():
    layer = make_layer().eval()
    ei = random_graph(6, 30, 2)
    q = 5 * torch.randn(30, 5, dtype=torch.float64)
    w = layer.attention_weights(q, ei[1], 6)
    total = scatter(w, ei[1], 0, dim_size=6, reduce="sum")
    alpha = w / (total[ei[1]] + layer.eps)
    sums = scatter(alpha, ei[1], 0, dim_size=6, reduce="sum")
    has_in = torch.bincount(ei[1], minlength=6) > 0
    torch.testing.assert_close(sums[has_in], torch.ones_like(sums[has_in]), rtol=0, atol=1e-6)
    # Up to the sqrt(eps) floor added to every weight, this is softmax(q) over each tail's incoming edges, per channel.
    t0 = int(ei[1][0])
    inc = ei[1] == t0
    floor = int(inc.sum()) * layer.eps**0.5
    torch.testing.assert_close(alpha[inc], torch.softmax(q[inc], 0), rtol=0, atol=floor)
    assert (alpha[inc] - torch.softmax(q[inc], 0)).abs().max() > 0  # the floor is really there


def test_edge_removal_drops_edges_only_in_training():
    layer = make_layer().train()
    q = torch.zeros(4000, 5, dtype=torch.float64)
    tails = torch.zeros(4000, dtype=torch.long)
    w = layer.attention_weights(q, tails, 1)
    dropped = (w < 1e-3).double().mean()
    assert abs(float(dropped) - 0.3) < 0.03
    layer.eval()
    assert (layer.attention_weights(q, tails, 1) > 0.5).all()


def test_no_affine_batch_norm_uses_bessel_and_has_no_parameters():
    bn = NoAffineBatchNorm(3).double()
    x = torch.randn(10, 3, dtype=torch.float64)
    y = bn(x)
    assert list(bn.parameters()) == []
    torch.testing.assert_close(y.var(0, unbiased=True), torch.ones(3, dtype=torch.float64), rtol=0, atol=1e-6)
    torch.testing.assert_close(bn.running_var, 0.9 + 0.1 * x.var(0, unbiased=True), rtol=0, atol=1e-12)


def test_no_affine_batch_norm_fast_path_matches_naive_var_in_float64():
    """The centred-sum variance (fast path) vs ``(x - mean) / sqrt(var(unbiased) + eps)``: outputs, gradients, stats."""
    torch.manual_seed(0)
    bn = NoAffineBatchNorm(4, eps=1e-3).double()
    x = (3 * torch.randn(2, 9, 4, dtype=torch.float64) + 5).requires_grad_(True)
    c = torch.randn(2, 9, 4, dtype=torch.float64)
    y = bn(x)
    flat = x.reshape(-1, 4)
    naive = ((flat - flat.mean(0)) / torch.sqrt(flat.var(0, unbiased=True) + 1e-3)).view_as(x)
    torch.testing.assert_close(y, naive, rtol=1e-12, atol=1e-12)
    (gy,) = torch.autograd.grad((y * c).sum(), x)
    (gn,) = torch.autograd.grad((naive * c).sum(), x)
    torch.testing.assert_close(gy, gn, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(bn.running_mean, 0.1 * flat.mean(0).detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(bn.running_var, 0.9 + 0.1 * flat.var(0, unbiased=True).detach(), rtol=0, atol=1e-12)


def test_edge_removal_fast_path_has_the_distribution_of_dropout():
    """Naive twin: ``F.dropout``. Keep rate 1 - p per element, kept values scaled by 1 / (1 - p), mean preserved."""
    w = torch.rand(400, 250, dtype=torch.float64) + 0.5
    g = torch.Generator().manual_seed(3)
    for p in (0.1, 0.5):
        out = edge_removal(w, p, g)
        kept = out != 0
        n = w.numel()
        assert abs(float(kept.double().mean()) - (1 - p)) < 4 * (p * (1 - p) / n) ** 0.5
        torch.testing.assert_close(out[kept], w[kept] / (1 - p), rtol=1e-12, atol=0)
        naive = torch.nn.functional.dropout(w, p, training=True)
        assert abs(float(out.mean() - naive.mean())) < 0.01
        # every channel and every row is thinned, not whole blocks (the 16-bit lanes are independent)
        assert kept.double().mean(0).min() > 1 - p - 0.15 and kept.double().mean(1).min() > 1 - p - 0.15
    assert edge_removal(w, 0.0) is w
    a = edge_removal(w, 0.3, torch.Generator().manual_seed(1))
    b = edge_removal(w, 0.3, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and not torch.equal(a, edge_removal(w, 0.3, torch.Generator().manual_seed(2)))


def test_pooling_head_sums_groups_separately():
    torch.manual_seed(0)
    head = PoolingHead(4, 3, expected_nodes=2.0, expected_edges=4.0, expected_added=8.0).double()
    x, e = torch.randn(5, 4, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    node_batch, edge_batch = torch.tensor([0, 0, 1, 1, 1]), torch.tensor([0, 0, 0, 1, 1, 1])
    added = torch.tensor([False, True, True, False, False, True])
    out = head(x, e, node_batch, edge_batch, added, 2)
    z0 = torch.cat([x[:2].sum(0) / 2, e[0] / 4, (e[1] + e[2]) / 8])
    u, g = head.glu(z0).chunk(2)
    ref = head.out(torch.cat([u * torch.nn.functional.mish(g), z0]))
    torch.testing.assert_close(out[0], ref, rtol=1e-12, atol=1e-12)
    # Moving an edge from "existing" to "added" changes the readout.
    assert not torch.allclose(head(x, e, node_batch, edge_batch, ~added, 2), out)
    with pytest.raises(ConfigError, match="expected_added"):
        PoolingHead(4, 3, expected_added=0.0)


def odd_batch() -> Batch:
    """A single atom, a disconnected molecule, and molecules smaller than the encoding steps (K > N)."""
    single = Data(
        x=torch.tensor([[3]]),
        edge_index=torch.zeros(2, 0, dtype=torch.long),
        edge_attr=torch.zeros(0, dtype=torch.long),
        y=torch.zeros(1),
    )
    a, b = molecule(4, 1), molecule(3, 2)
    disconnected = Data(
        x=torch.cat([a.x, b.x]),
        edge_index=torch.cat([a.edge_index, b.edge_index + 4], 1),
        edge_attr=torch.cat([a.edge_attr, b.edge_attr]),
        y=torch.zeros(1),
    )
    return Batch.from_data_list([single, disconnected, molecule(9, 3), molecule(12, 4)])


@pytest.mark.parametrize("encoding", ["rrwp", "drrwp", "none"])
def test_grass_net_odd_graphs_and_every_parameter_gets_a_gradient(encoding: str):
    torch.manual_seed(0)
    net = GrassNet(
        num_layers=2,
        dim=8,
        hidden_dim=8,
        encoding=encoding,
        encoding_steps=16,
        num_components=4,
        added_edges_per_node=3,
    )
    b = odd_batch()
    y = net(b.x, b.edge_index, b.edge_attr, b.batch)
    assert y.shape == (4,) and torch.isfinite(y).all()
    y.square().sum().backward()
    for name, p in net.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name} got no gradient"


def test_grass_net_is_permutation_invariant_without_rewiring():
    torch.manual_seed(0)
    net = GrassNet(num_layers=2, dim=8, hidden_dim=8, encoding_steps=4, added_edges_per_node=0).double().eval()
    d = molecule(9, 5)
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(1))
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(9)
    batch = torch.zeros(9, dtype=torch.long)
    y1 = net(d.x, d.edge_index, d.edge_attr, batch)
    y2 = net(d.x[perm], inv[d.edge_index], d.edge_attr, batch)
    torch.testing.assert_close(y1, y2, rtol=1e-10, atol=1e-10)


def test_grass_net_rewiring_makes_predictions_stochastic_and_config_errors():
    torch.manual_seed(0)
    net = GrassNet(num_layers=1, dim=8, hidden_dim=8, encoding_steps=4, added_edges_per_node=2).eval()
    b = odd_batch()
    y1, y2 = net(b.x, b.edge_index, b.edge_attr, b.batch), net(b.x, b.edge_index, b.edge_attr, b.batch)
    assert (y1 - y2).abs().max() > 1e-6, "a fresh random graph is drawn at every call"
    with pytest.raises(ConfigError, match="encoding"):
        GrassNet(encoding="spd")
    with pytest.raises(ConfigError, match="edge_removal_rate"):
        GrassNet(edge_removal_rate=1.0)


@pytest.mark.parametrize("cls", [GINENet, GPSNet])
def test_baselines_forward_backward(cls):
    torch.manual_seed(0)
    net = cls(num_layers=2, dim=8)
    b = odd_batch()
    y = net(b.x, b.edge_index, b.edge_attr, b.batch)
    assert y.shape == (4,) and torch.isfinite(y).all()
    y.sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    assert count_parameters(net) > 0
    with pytest.raises(ConfigError):
        GPSNet(dim=10, heads=4)
