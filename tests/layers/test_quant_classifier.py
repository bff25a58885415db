"""Classifier quantization: the transforms are equivalences, the quantizer matches a naive twin,
W8A8 RTN keeps a trained classifier's accuracy and W4A4 changes its predictions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from callbacks.quant_classifier import ClassifierQuantCalibration
from layers.quant.classifier import QLayer, QuantizedClassifier
from ops.quant import Quantizer

pytestmark = pytest.mark.usefixtures("one_thread")


class TinyNet(nn.Module):
    """A CNN stem (a grouped and a reflect-padded conv among them) feeding a token MLP, like a small hybrid ViT."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1, groups=8),
            nn.Conv2d(8, 16, 3, stride=2, padding=1, padding_mode="reflect"),
            nn.GELU(),
        )
        self.mix = nn.Linear(16, 24)  # tokens [B, 16, 16] -> [B, 16, 24]
        self.head = nn.Linear(24, classes)  # a non-power-of-two input: random orthogonal instead of Hadamard

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.stem(x).flatten(2).transpose(1, 2)
        return self.head(F.gelu(self.mix(t)).mean(1))


def _data(n: int, seed: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    proto = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(99))
    x = proto[y] + 0.6 * torch.randn(n, 3, 8, 8, generator=g)
    return x.to(dtype), y


def _model(dtype=torch.float64) -> TinyNet:
    torch.manual_seed(0)
    m = TinyNet().to(dtype)
    with torch.no_grad():  # non-trivial batch-norm statistics
        m.stem[1].running_mean.uniform_(-0.5, 0.5)
        m.stem[1].running_var.uniform_(0.5, 2.0)
    return m.eval()


@pytest.fixture(scope="module")
def trained() -> TinyNet:
    torch.manual_seed(0)
    m = TinyNet()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    x, y = _data(512, 1)
    for _ in range(60):
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        opt.step()
    return m.eval()


def _cb(**kw) -> ClassifierQuantCalibration:
    return ClassifierQuantCalibration(**{"steps": 8, "rotate_lr": 0.5, "smooth_lr": 0.05, **kw})


@pytest.mark.parametrize("method", ["smoothquant", "quarot", "ostquant"])
def test_transforms_are_equivalences_in_float64(method: str) -> None:
    """With quantization off, the transformed model's logits equal the original's to 1e-10 (float64)."""
    model = _model()
    x, _ = _data(16, 2, torch.float64)
    calib = [_data(16, 3, torch.float64)[0]]
    with torch.no_grad():
        ref = model(x)
    if method == "ostquant":  # learn at W4A4 (the KL is zero without quantization), then switch quantization off
        q = _cb(w_bits=4, a_bits=4).build(model, method, calib, steps=8, freeze=False)
        q.set_quant(False)
    else:  # bits = 16: no quantization, the transforms folded into the frozen weights
        q = _cb(w_bits=16, a_bits=16).build(model, method, calib, steps=0)
    layers = q.layers
    with torch.no_grad():
        out = model(x)
    q.detach()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    mix = layers["mix"]
    if method in ("smoothquant", "ostquant"):  # the smoothing is really there
        assert mix.scale is not None and float((mix.scale.detach() - 1).abs().max()) > 1e-3
    if method in ("quarot", "ostquant"):
        conv = layers["stem.4"]
        assert conv.rotation is not None and not torch.allclose(conv.rotation.abs(), torch.eye(8, dtype=x.dtype))
        assert layers["stem.3"].rotation is None  # depthwise: not transformable
    if method == "ostquant":  # the rotation moved off its Hadamard init and stayed orthogonal
        init = QuantizedClassifier(_model(), rotation="hadamard", learn=True).layers["mix"].rotation
        assert float((mix.rotation.detach() - init.detach()).abs().max()) > 1e-5
        eye = torch.eye(16, dtype=x.dtype)
        torch.testing.assert_close(mix.rotation.T @ mix.rotation, eye, rtol=0, atol=1e-10)


def test_detach_restores_the_model() -> None:
    model = _model()
    x, _ = _data(8, 2, torch.float64)
    with torch.no_grad():
        ref = model(x)
    q = _cb(w_bits=4, a_bits=4).build(model, "quarot", [x], steps=0)
    with torch.no_grad():
        assert (model(x) - ref).abs().max() > 1e-3  # W4A4: the logits move
    q.detach()
    assert not any(isinstance(m, QLayer) for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(x), ref)


def _naive_fake_quant(row: torch.Tensor, bits: int, symmetric: bool) -> torch.Tensor:
    """One row, as the formulas of :mod:`ops.quant.fake` read (a loop twin of ``fake_quant``)."""
    lo, hi = min(float(row.min()), 0.0), max(float(row.max()), 0.0)
    out = torch.empty_like(row)
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        s = max(max(-lo / (qmax + 1), hi / qmax), 1e-8)
        for i, v in enumerate(row.tolist()):
            out[i] = min(max(round(v / s), -qmax - 1), qmax) * s
    else:
        qmax = 2**bits - 1
        s = max((hi - lo) / qmax, 1e-8)
        z = round(-lo / s)
        for i, v in enumerate(row.tolist()):
            out[i] = (min(max(round(v / s) + z, 0), qmax) - z) * s
    return out


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_conv_and_linear_match_a_naive_twin(bits: int) -> None:
    """Weights per output channel (symmetric), activations per pixel across channels / per token (asymmetric)."""
    torch.manual_seed(1)
    conv = nn.Conv2d(4, 5, 3, padding=1).double()
    lin = nn.Linear(6, 3).double()
    x = torch.randn(2, 4, 5, 5, dtype=torch.float64) * 3
    t = torch.randn(2, 7, 6, dtype=torch.float64)
    for base, inp in ((conv, x), (lin, t)):
        q = QLayer(base, Quantizer(bits, symmetric=False), bits, "signed")
        q.freeze()
        w = base.weight.detach().reshape(base.weight.shape[0], -1)
        wq = torch.stack([_naive_fake_quant(r, bits, True) for r in w]).reshape(base.weight.shape)
        if base is conv:
            xq = torch.empty_like(inp)
            for b in range(2):
                for i in range(5):
                    for j in range(5):
                        xq[b, :, i, j] = _naive_fake_quant(inp[b, :, i, j], bits, False)
            want = F.conv2d(xq, wq, base.bias, padding=1)
        else:
            xq = torch.stack([torch.stack([_naive_fake_quant(r, bits, False) for r in e]) for e in inp])
            want = F.linear(xq, wq, base.bias)
        with torch.no_grad():
            torch.testing.assert_close(q(inp), want, rtol=0, atol=1e-12)


def _acc(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(-1) == y).float().mean())


def test_w8a8_rtn_keeps_accuracy_and_w4a4_changes_the_model(trained: TinyNet) -> None:
    x, y = _data(512, 7)
    fp = _acc(trained, x, y)
    assert fp > 0.9, fp  # the classifier learned its task
    with torch.no_grad():
        ref = trained(x)
    q = _cb(w_bits=8, a_bits=8).build(trained, "rtn", [x[:64]], steps=0)
    w8 = _acc(trained, x, y)
    q.detach()
    assert fp - w8 <= 0.02, (fp, w8)
    for method in ("rtn", "smoothquant", "quarot", "ostquant"):
        q = _cb(w_bits=4, a_bits=4).build(trained, method, [x[:64]], steps=8)
        with torch.no_grad():
            out = trained(x)
        q.detach()
        assert (out - ref).abs().max() > 1e-2, f"{method}: the W4A4 model predicts as full precision"
        assert torch.isfinite(out).all()


def test_evaluate_scores_accuracy_and_kl(trained: TinyNet) -> None:
    x, y = _data(64, 8)
    cb = _cb(w_bits=4, a_bits=4)
    with torch.no_grad():
        fp = [trained(x)]
    r = cb.evaluate(trained, [(x, y)], fp)
    assert r["kl"] < 1e-10 and r["acc"] == _acc(trained, x, y)
    q = cb.build(trained, "rtn", [x], steps=0)
    r4 = cb.evaluate(trained, [(x, y)], fp)
    q.detach()
    assert r4["kl"] > 1e-6
