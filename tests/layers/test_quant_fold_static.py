"""BatchNorm folding of a whole classifier (layers/quant/fold.py) and the static per-tensor activation scales of
:class:`layers.quant.classifier.QuantizedClassifier` with the callback options that select them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from callbacks.quant_classifier import ClassifierQuantCalibration
from core.errors import ConfigError
from layers.quant.classifier import QuantizedClassifier
from layers.quant.fold import FoldedBatchNorm
from lightning_modules.badloss.nets import SmallCNN
from ops.quant.static import StaticQuantizer

pytestmark = pytest.mark.usefixtures("one_thread")


def _randomise_bn(model: nn.Module) -> None:
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for bn in model.modules():
            if isinstance(bn, nn.BatchNorm2d):
                n = bn.num_features
                bn.running_mean.copy_(torch.rand(n, generator=g) * 2 - 1)
                bn.running_var.copy_(torch.rand(n, generator=g) * 2 + 0.3)
                bn.weight.copy_(torch.rand(n, generator=g) * 1.5 + 0.5)
                bn.bias.copy_(torch.rand(n, generator=g) * 4 - 2)


class ResStyle(nn.Module):
    """ResNet-style attributes (``conv1`` / ``bn1`` not in a Sequential), a conv without bias, a plain residual."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        h = torch.relu(h + self.bn2(self.conv2(h)))
        return self.head(h.mean((2, 3)))


class SharedOutput(nn.Module):
    """A conv whose output feeds its BatchNorm and a skip connection: folding it would change the skip."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.conv(x)
        return self.head((self.bn(c) + c).mean((2, 3)))


@pytest.mark.parametrize("make", [lambda: SmallCNN(1, 10, width=8), ResStyle])
def test_folded_model_equals_unfolded_in_eval_float64(make) -> None:
    torch.manual_seed(0)
    model = make().double()
    _randomise_bn(model)
    model.eval()
    x = torch.randn(6, 1, 28, 28, dtype=torch.float64)
    ref = model(x)
    convs = {n: m for n, m in model.named_modules() if isinstance(m, nn.Conv2d)}
    fold = FoldedBatchNorm(model, lambda: model(x))
    assert len(fold.pairs) == 2 and not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert torch.allclose(model(x), ref, rtol=0, atol=1e-12)
    fold.restore()
    assert {n: m for n, m in model.named_modules() if isinstance(m, nn.Conv2d)} == convs  # the same objects back
    assert sum(isinstance(m, nn.BatchNorm2d) for m in model.modules()) == 2
    assert torch.equal(model(x), ref)


def test_fold_refuses_a_shared_conv_output_and_skips_training_batchnorm() -> None:
    torch.manual_seed(0)
    model = SharedOutput().double()
    _randomise_bn(model)
    model.eval()
    x = torch.randn(2, 1, 8, 8, dtype=torch.float64)
    ref = model(x)
    with pytest.raises(ValueError, match="changes the model's output"):
        FoldedBatchNorm(model, lambda: model(x))
    assert isinstance(model.bn, nn.BatchNorm2d) and torch.equal(model(x), ref)  # restored
    cnn = SmallCNN(1, 10, width=4).double().train()  # batch statistics: not a fixed affine map, left alone
    FoldedBatchNorm(cnn, lambda: cnn(torch.randn(4, 1, 28, 28, dtype=torch.float64)))
    assert sum(isinstance(m, nn.BatchNorm2d) for m in cnn.modules()) == 2


class Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [B, T, 8]
        return self.b(torch.relu(self.a(x))).mean(1)


def test_static_scales_are_calibrated_per_layer_input_and_fixed() -> None:
    torch.manual_seed(0)
    model = Tokens().double().eval()
    calib = [torch.randn(4, 5, 8, dtype=torch.float64) for _ in range(2)]
    calib[1][0, 0, 2] = 30.0  # an outlier in one token of one calibration batch
    seen: dict[str, list[torch.Tensor]] = {"a": [], "b": []}
    hooks = [getattr(model, n).register_forward_pre_hook(lambda m, i, n=n: seen[n].append(i[0])) for n in seen]
    for x in calib:
        model(x)
    for h in hooks:
        h.remove()
    q = QuantizedClassifier(model, w_bits=16, a_bits=4, act_scale="tensor")
    assert all(isinstance(layer.act_quant, StaticQuantizer) for layer in q.layers.values())
    assert q.layers["a"].act_quant is not q.layers["b"].act_quant  # one quantizer per layer input
    q.calibrate_activations(model, calib)
    for name, xs in seen.items():  # the range of the layer's whole input over every calibration batch
        aq = q.layers[name].act_quant
        assert float(aq.lo) == pytest.approx(min(min(float(x.min()) for x in xs), 0.0), abs=1e-12)
        assert float(aq.hi) == pytest.approx(max(max(float(x.max()) for x in xs), 0.0), abs=1e-12)
    assert float(q.layers["a"].act_quant.hi) == 30.0
    # static: an example's logits do not depend on the batch it comes in
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    assert torch.allclose(model(x)[:1], model(x[:1]), atol=1e-12)
    q.set_quant(False)  # off: the full-precision model
    q.detach()
    ref = model(x)
    q2 = QuantizedClassifier(model, w_bits=16, a_bits=4, act_scale="tensor")
    q2.set_quant(False)
    assert torch.allclose(model(x), ref, atol=1e-12)
    q2.detach()
    with pytest.raises(ValueError, match="act_scale"):
        QuantizedClassifier(model, act_scale="channel")


def test_callback_folds_calibrates_and_restores() -> None:
    torch.manual_seed(0)
    model = SmallCNN(1, 10, width=8)
    _randomise_bn(model)
    model.eval()
    x = torch.randn(16, 1, 28, 28)
    ref = model(x)
    cb = ClassifierQuantCalibration(act_scale="tensor", fold_bn=True, calib_split="val", steps=2)
    fold = cb.fold(model, [x])
    assert fold is not None and len(fold.pairs) == 2
    q = cb.build(model, "smoothquant", [x], steps=0)
    ranges = [layer.act_quant for layer in q.layers.values()]
    assert all(isinstance(a, StaticQuantizer) and a.calibrated for a in ranges)
    q.detach()
    fold.restore()
    assert torch.equal(model(x), ref)
    assert ClassifierQuantCalibration().fold(model, [x]) is None  # off by default
    for bad in ({"act_scale": "channel"}, {"calib_split": "test"}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            ClassifierQuantCalibration(**bad)
