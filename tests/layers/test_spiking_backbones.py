"""TS-LIF backbones: spiking GRU gates fast-vs-naive parity, shapes, finiteness, gradients to every parameter."""

from __future__ import annotations

import pytest
import torch

from layers.spiking.backbones import (
    Forecaster,
    GRUReferenceBackbone,
    InstanceNorm,
    SpikingGRUBackbone,
    SpikingGRUGates,
    SpikingTCNBackbone,
)
from layers.spiking.neurons import make_neuron


def test_spiking_gru_gates_fast_matches_naive_cell():
    torch.manual_seed(0)
    g = SpikingGRUGates(6).double()
    x = torch.randn(4, 9, 6, dtype=torch.float64, requires_grad=True)
    w_h = torch.randn(18, 6, dtype=torch.float64)  # irrelevant when the previous hidden state is zero
    fast, naive = g(x), g.naive_forward(x, w_h)
    torch.testing.assert_close(fast, naive, rtol=0, atol=0)
    assert 0 < fast.mean().item() < 1
    w = torch.randn_like(fast)
    params = [x, *g.parameters()]
    gf = torch.autograd.grad((fast * w).sum(), params)
    gn = torch.autograd.grad((naive * w).sum(), params)
    for a, b in zip(gf, gn):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_instance_norm_round_trip():
    x = torch.randn(3, 20, 4, dtype=torch.float64) * 5 + 2
    xn, mean, std = InstanceNorm()(x)
    torch.testing.assert_close(xn.mean(1), torch.zeros(3, 4, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(InstanceNorm.denorm(xn, mean, std), x, rtol=1e-12, atol=1e-12)


def _backbone(kind: str, neuron: str, hidden: int = 8):
    if kind == "gru":
        return SpikingGRUBackbone(hidden, make_neuron(neuron, hidden, theta=0.3), theta=0.0)
    if kind == "tcn":
        return SpikingTCNBackbone(hidden, lambda: make_neuron(neuron, hidden, theta=0.3), num_steps=3, theta=0.0)
    return GRUReferenceBackbone(hidden)


@pytest.mark.parametrize(
    "kind,neuron", [("gru", "ts_lif"), ("gru", "lif"), ("gru", "tc_lif"), ("tcn", "ts_lif"), ("gru_ref", "ts_lif")]
)
def test_forecaster_shapes_and_gradients(kind, neuron):
    torch.manual_seed(0)
    model = Forecaster(_backbone(kind, neuron), 8, horizon=5)
    x = torch.randn(4, 24, 3) * 2
    y = model(x)
    assert y.shape == (4, 5, 3) and torch.isfinite(y).all()
    (y**2).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, missing
    dead = [n for n, p in model.named_parameters() if p.grad.abs().sum() == 0]
    assert not dead, dead
