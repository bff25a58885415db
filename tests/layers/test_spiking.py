"""TS-LIF neurons: surrogate, naive-vs-training-form parity (float64, outputs/states/grads), stability analysis."""

from __future__ import annotations

import math

import pytest
import torch

from core.errors import ConfigError
from layers.spiking.neurons import (
    LIFNeuron,
    TCLIFNeuron,
    TSLIFNeuron,
    lif_step,
    make_neuron,
    tclif_step,
    tslif_step,
)
from layers.spiking.stability import frequency_response, linear_response, spectral_radius, system_matrix
from layers.spiking.surrogate import atan_primitive, atan_surrogate_grad, spike

D = torch.float64


def _inputs(shape=(3, 20, 5), scale=1.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=D) * scale + 0.8).requires_grad_()


# -- surrogate --------------------------------------------------------------------------------------------------------
def test_spike_forward_is_heaviside_and_backward_is_atan():
    x = torch.tensor([-1.0, -1e-3, 0.0, 2e-3, 0.7], dtype=D, requires_grad=True)
    s = spike(x, 2.0)
    assert s.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]
    s.sum().backward()
    x2 = x.detach().clone().requires_grad_()
    atan_primitive(x2, 2.0).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-12, atol=1e-12)
    # hand values: g'(0) = alpha/2 = 1; g'(0.7) = 1 / (1 + (0.7 pi)^2)
    assert x.grad[2].item() == pytest.approx(1.0)
    assert x.grad[4].item() == pytest.approx(1 / (1 + (0.7 * math.pi) ** 2))
    assert atan_surrogate_grad(torch.tensor(0.0), 4.0).item() == pytest.approx(2.0)


# -- parity: naive per-step functions vs the modules' training form ---------------------------------------------------
def _grads(out, params):
    return torch.autograd.grad(out, params, allow_unused=True)


@pytest.mark.parametrize("somatic_injection,dendritic_spike", [(True, True), (False, True), (True, False)])
def test_tslif_training_form_matches_naive_steps(somatic_injection, dendritic_spike):
    torch.manual_seed(0)
    n = TSLIFNeuron(5, somatic_injection=somatic_injection, dendritic_spike=dendritic_spike).double()
    x = _inputs()
    y, vd, vs = n(x, return_states=True)
    v_d = torch.zeros(3, 5, dtype=D)
    v_s = torch.zeros(3, 5, dtype=D)
    ys, vds, vss = [], [], []
    for t in range(x.shape[1]):
        yt, v_d, v_s = tslif_step(
            x[:, t], v_d, v_s, n.d(), n.kappa, n.gamma_ds, n.alpha_s, n.alpha_d_eff(), dendritic_spike=dendritic_spike
        )
        ys.append(yt)
        vds.append(v_d)
        vss.append(v_s)
    y_ref, vd_ref, vs_ref = torch.stack(ys, 1), torch.stack(vds, 1), torch.stack(vss, 1)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(vd, vd_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(vs, vs_ref, rtol=1e-12, atol=1e-12)
    assert 0 < (y != 0).double().mean().item() < 1  # some steps fire, so the reset paths are exercised
    params = [x, *[p for p in n.parameters()]]
    w = torch.randn_like(y)
    g = _grads((y * w).sum() + vd.sum() + vs.sum(), params)
    g_ref = _grads((y_ref * w).sum() + vd_ref.sum() + vs_ref.sum(), params)
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert g[0].abs().sum() > 0
    if not somatic_injection:
        assert g[1][3].item() == 0.0  # d3 is masked out: no gradient reaches it


def test_no_dendritic_spike_ablation_only_silences_the_output():
    """Ablation 'w/o dendritic spike' (notes: alpha_d = 0): same potentials as TS-LIF (the dendrite keeps its soft
    reset), the output loses exactly the alpha_d * s_d term, and there is no alpha_d parameter."""
    torch.manual_seed(0)
    full = TSLIFNeuron(5).double()
    ablated = TSLIFNeuron(5, dendritic_spike=False).double()
    with torch.no_grad():
        ablated.alpha_s.copy_(full.alpha_s)
    x = _inputs(scale=3.0)
    y, vd, vs = full(x, return_states=True)
    y_ab, vd_ab, vs_ab = ablated(x, return_states=True)
    torch.testing.assert_close(vd_ab, vd, rtol=0, atol=0)
    torch.testing.assert_close(vs_ab, vs, rtol=0, atol=0)
    s_d = (y - y_ab) / full.alpha_d  # the removed term is alpha_d * s_d with binary s_d
    assert set(s_d.detach().round(decimals=9).unique().tolist()) == {0.0, 1.0}
    assert ablated.alpha_d is None and "alpha_d" not in dict(ablated.named_parameters())


def test_tslif_both_spike_kinds_fire():
    torch.manual_seed(0)
    n = TSLIFNeuron(5).double()
    x = _inputs(scale=3.0)
    with torch.no_grad():
        v_d = torch.zeros(3, 5, dtype=D)
        v_s = torch.zeros(3, 5, dtype=D)
        fired_d = fired_s = 0
        for t in range(x.shape[1]):
            pre_d = n.d()[0] * v_d + n.d()[1] * x[:, t] - n.gamma_ds * v_s
            pre_s = n.d()[2] * v_s + n.d()[3] * x[:, t] - n.kappa * pre_d
            fired_d += int((pre_d >= 1).sum())
            fired_s += int((pre_s >= 1).sum())
            _, v_d, v_s = tslif_step(x[:, t], v_d, v_s, n.d(), n.kappa, n.gamma_ds, n.alpha_s, n.alpha_d)
    assert fired_d > 0 and fired_s > 0


def test_lif_training_form_matches_naive_steps():
    n = LIFNeuron(beta=0.7, detach_reset=False).double()
    x = _inputs()
    y, v = n(x, return_states=True)
    vt = torch.zeros(3, 5, dtype=D)
    ys, vs = [], []
    for t in range(x.shape[1]):
        s, vt = lif_step(x[:, t], vt, n.beta.clamp(0, 1))
        ys.append(s)
        vs.append(vt)
    y_ref, v_ref = torch.stack(ys, 1), torch.stack(vs, 1)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
    torch.testing.assert_close(v, v_ref, rtol=1e-12, atol=1e-12)
    assert 0 < y.mean().item() < 1
    g = _grads(y.sum() + v.sum(), [x, n.beta])
    g_ref = _grads(y_ref.sum() + v_ref.sum(), [x, n.beta])
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_tclif_training_form_matches_naive_steps():
    n = TCLIFNeuron(c1=0.3, c2=-0.2).double()
    x = _inputs()
    y, ud, us = n(x, return_states=True)
    b1, b2 = n.betas()
    u_d = torch.zeros(3, 5, dtype=D)
    u_s = torch.zeros(3, 5, dtype=D)
    ys, uds, uss = [], [], []
    for t in range(x.shape[1]):
        s, u_d, u_s = tclif_step(x[:, t], u_d, u_s, b1, b2)
        ys.append(s)
        uds.append(u_d)
        uss.append(u_s)
    refs = torch.stack(ys, 1), torch.stack(uds, 1), torch.stack(uss, 1)
    for a, b in zip((y, ud, us), refs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert 0 < y.mean().item() < 1
    g = _grads(y.sum() + ud.sum() + us.sum(), [x, n.c])
    g_ref = _grads(sum(r.sum() for r in refs), [x, n.c])
    for a, b in zip(g, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["ts_lif", "tc_lif", "lif"])
def test_fused_scan_matches_naive_steps_with_detached_reset_and_extra_dims(kind):
    """The fused scan (hand-written BPTT) with a detached reset and ``[B, T, L, H]`` input (the TCN's layout), only
    ``y`` used downstream: outputs and gradients equal autograd through the naive per-step functions."""
    torch.manual_seed(1)
    if kind == "ts_lif":
        n = TSLIFNeuron(5, detach_reset=True).double()
    elif kind == "tc_lif":
        n = TCLIFNeuron(c1=0.3, c2=-0.2, detach_reset=True).double()
    else:
        n = LIFNeuron(beta=0.8, detach_reset=True).double()
    x = _inputs(shape=(2, 15, 3, 5), seed=3)
    y = n(x)
    flat = x.movedim(1, 0).reshape(15, 6, 5)  # [T, B*L, H]: the step functions take [N, H]
    state = [torch.zeros(6, 5, dtype=D), torch.zeros(6, 5, dtype=D)]
    ys = []
    for t in range(15):
        if kind == "ts_lif":
            yt, *state = tslif_step(
                flat[t], *state, n.d(), n.kappa, n.gamma_ds, n.alpha_s, n.alpha_d, detach_reset=True
            )
        elif kind == "tc_lif":
            yt, *state = tclif_step(flat[t], *state, *n.betas(), detach_reset=True)
        else:
            yt, state[0] = lif_step(flat[t], state[0], n.beta.clamp(0, 1), detach_reset=True)
        ys.append(yt)
    y_ref = torch.stack(ys).reshape(15, 2, 3, 5).movedim(0, 1)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    assert 0 < (y != 0).double().mean().item() < 1
    params = [x, *n.parameters()]
    w = torch.randn_like(y)
    for a, b in zip(_grads((y * w).sum(), params), _grads((y_ref * w).sum(), params)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _graph_nodes(fn) -> int:
    seen, stack = set(), [fn]
    while stack:
        f = stack.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        stack += [g for g, _ in f.next_functions]
    return len(seen)


def test_training_form_graph_does_not_grow_with_time_steps():
    """The fused scan records one autograd node for the whole recurrence, not a graph per time step."""
    n = TSLIFNeuron(4)
    short, long = n(torch.randn(2, 5, 4)), n(torch.randn(2, 60, 4))
    assert type(long.grad_fn).__name__ == "_TwoCompartmentScanBackward"
    assert _graph_nodes(long.grad_fn) == _graph_nodes(short.grad_fn) < 30


# -- stability analysis -------------------------------------------------------------------------------------------
def _init_matrices():
    n = TSLIFNeuron(4).double()
    c = n.coefficients()
    return system_matrix(c["d"].detach(), c["kappa"].detach(), c["gamma_ds"].detach())


def test_system_matrix_and_spectral_radius_hand_values():
    a, b = _init_matrices()
    torch.testing.assert_close(a, torch.tensor([[0.8, -0.1], [-0.64, 0.38]], dtype=D), rtol=0, atol=1e-7)
    torch.testing.assert_close(b, torch.tensor([0.2, 0.54], dtype=D), rtol=0, atol=1e-7)
    eig = torch.linalg.eigvals(a).real.sort().values
    # trace 1.18, det 0.24: lambda = (1.18 +- sqrt(1.18^2 - 0.96)) / 2
    root = math.sqrt(1.18**2 - 0.96)
    assert eig.tolist() == pytest.approx([(1.18 - root) / 2, (1.18 + root) / 2], abs=1e-6)
    assert spectral_radius(a).item() == pytest.approx((1.18 + root) / 2, abs=1e-6)
    assert spectral_radius(a).item() < 1  # stable at initialisation


def test_frequency_response_hand_values():
    a, b = _init_matrices()
    h_d, h_s = frequency_response(a, b, torch.tensor([0.0, math.pi], dtype=D))
    # omega = 0: (I - A)^-1 B = (7/6, -1/3); omega = pi: (I + A)^-1 B = (3/22, 5/11)
    assert h_d.real.tolist() == pytest.approx([7 / 6, 3 / 22], abs=1e-6)
    assert h_s.real.tolist() == pytest.approx([-1 / 3, 5 / 11], abs=1e-6)
    assert h_d.imag.abs().max().item() < 1e-9
    # the notes' values at pi/4 (dendrite) and pi/8 (soma), computed by hand from (I - A e^{-jw})^{-1} B
    g_d, _ = frequency_response(a, b, torch.tensor([math.pi / 4], dtype=D))
    _, g_s = frequency_response(a, b, torch.tensor([math.pi / 8], dtype=D))
    assert g_d.abs().item() == pytest.approx(0.230, abs=5e-4)
    assert g_s.abs().item() == pytest.approx(0.736, abs=5e-4)
    # dendrite low-pass, soma rises away from DC (frequency separation)
    w = torch.linspace(0, math.pi, 33, dtype=D)
    hd, hs = frequency_response(a, b, w)
    assert hd.abs().argmax().item() == 0 and hs.abs()[4] > hs.abs()[0]


def test_tclif_is_marginally_stable():
    n = TCLIFNeuron(c1=0.4, c2=-1.0).double()
    c = n.coefficients()
    a, _ = system_matrix(c["d"].detach(), c["kappa"].detach(), c["gamma_ds"].detach())
    assert torch.linalg.det(a).item() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("kind", ["ts_lif", "tc_lif"])
def test_subthreshold_dynamics_equal_linear_system(kind):
    """With an unreachable threshold the neuron is the linear system of Eq. (11): compare with the convolution."""
    n = (TSLIFNeuron(5, theta=1e9) if kind == "ts_lif" else TCLIFNeuron(c1=0.5, c2=-0.5, theta=1e9)).double()
    x = _inputs(shape=(2, 25, 5))
    _, v1, v2 = n(x, return_states=True)
    c = n.coefficients()
    a, b = system_matrix(c["d"], c["kappa"], c["gamma_ds"])
    v = linear_response(a, b, x)
    torch.testing.assert_close(v1, v[..., 0], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(v2, v[..., 1], rtol=1e-9, atol=1e-9)


def test_bad_neuron_config():
    with pytest.raises(ConfigError, match="theta"):
        TSLIFNeuron(4, theta=0.0)
    with pytest.raises(ConfigError, match="model.neuron='alif'"):
        make_neuron("alif", 4)
    with pytest.raises(ValueError, match=r"\[B, T, \*, H\]"):
        LIFNeuron()(torch.zeros(3, 4))
