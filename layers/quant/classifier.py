"""W/A fake quantization of a classifier's ``nn.Linear`` and ``nn.Conv2d`` layers with equivalent input transforms.

:class:`QuantizedClassifier` swaps, in place and reversibly (:meth:`~QuantizedClassifier.detach` restores the
original layers), every ``nn.Linear`` / ``nn.Conv2d`` of a model for a :class:`QLayer` that computes

``y = layer_{W'}(Q_a((x / s) R))``,  ``W' = Q_w(W diag(s) R)``

on the layer's *input* dimension (a linear's ``in_features``, a convolution's input channels, mixed per pixel): ``s``
a positive smoothing vector, ``R`` an orthogonal matrix. In full precision ``(x / s) R (W diag(s) R)^T = x W^T``
(and the same per kernel tap of a convolution, whose zero / reflect padding commutes with a per-pixel channel mix),
so every transform is an equivalence; ``tests/layers/test_quant_classifier.py`` checks it to 1e-10 in float64.
The transforms act online on the input (QuaRot's online Hadamard pattern) rather than being folded into the previous
op: a classifier's previous op is often a GELU, a pooling or a residual sum, which no per-channel scale commutes
with.

Quantization (:mod:`ops.quant`): weights symmetric per output channel (rows of ``W [out, in * kh * kw]``, RTN,
optional clip search); activations asymmetric, with ``act_scale``

* ``token`` (default): dynamic per token: per row of the last dimension for a linear (per token of a ViT, per
  example of an MLP head), per pixel across the input channels for a convolution (a 1-channel input, such as a
  grayscale stem, is then exact);
* ``tensor``: static per tensor (:class:`ops.quant.static.StaticQuantizer`): one range per layer input, every token
  and channel together, calibrated once by :meth:`QuantizedClassifier.calibrate_activations` (min / max of the
  layer's transformed input over the calibration batches); before that calibration, each input's own range.

Transforms per method (:class:`ClassifierQuantCalibration
<callbacks.quant_classifier.ClassifierQuantCalibration>`):

* ``rtn``: none. ``smoothquant``: ``s = max|X|^a / max|W|^(1-a)`` per input channel (``a = 0.5``), from calibration
  batches, on every transformable layer.
* ``quarot``: ``R`` a random Hadamard ``diag(signs) H`` of the input dimension (a random orthogonal matrix where it
  is not a power of two, as :func:`ops.quant.random_hadamard` does), on every transformable layer.
* ``ostquant``: linear layers learn ``R`` (Hadamard init, Cayley SGD on the Stiefel manifold) and ``s`` (init 1);
  convolutions keep QuaRot's fixed Hadamard.

Transformable: every ``nn.Linear`` and every ``nn.Conv2d`` with ``groups == 1`` (a depthwise / grouped convolution
does not commute with a channel mix: quantized, not transformed). Linears owned by ``nn.MultiheadAttention`` are
left alone (it reads ``out_proj.weight`` directly).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ops.quant import Quantizer, fake_quant, random_hadamard, rtn_weight
from ops.quant.static import StaticQuantizer

ROTATIONS = ("none", "hadamard")
ACT_SCALES = ("token", "tensor")


class QLayer(nn.Module):
    """A fake-quantized ``nn.Linear`` / ``nn.Conv2d`` with an input transform ``x -> (x / s) R`` (see module doc).

    Args:
        base: The layer (kept frozen and unchanged; its weight is read on the fly).
        act_quant: Activation quantizer (shared per-token :class:`ops.quant.Quantizer`, or the layer's own
            :class:`ops.quant.static.StaticQuantizer`).
        w_bits: Weight bits (16: full precision).
        w_sym_scale: Symmetric scale rule of :func:`ops.quant.fake_quant`.
    """

    def __init__(
        self, base: nn.Linear | nn.Conv2d, act_quant: Quantizer | StaticQuantizer, w_bits: int, w_sym_scale: str
    ) -> None:
        super().__init__()
        self.base = base
        self.conv = isinstance(base, nn.Conv2d)
        self.transformable = not self.conv or base.groups == 1
        self.n_in = base.weight.shape[1]
        self.rotation: nn.Parameter | None = None
        self.scale: nn.Parameter | None = None
        self.register_buffer("w_frozen", None)
        self.act_quant, self.w_bits, self.w_sym_scale = act_quant, w_bits, w_sym_scale
        self.w_quant_on = False  # fake-quantize the weight on the fly (straight-through) while transforms are learned
        self.amax: torch.Tensor | None = None  # max |x| per input channel while ``record`` (SmoothQuant)
        self.record = False

    def set_rotation(self, r: torch.Tensor, learn: bool) -> None:
        """Use ``R [in, in]`` (orthogonal) on the input dimension; ``learn``: as a trainable parameter."""
        self.rotation = nn.Parameter(r.to(self.base.weight), requires_grad=learn)

    def set_scale(self, s: torch.Tensor, learn: bool) -> None:
        """Use the smoothing vector ``s [in]`` (positive)."""
        self.scale = nn.Parameter(s.to(self.base.weight), requires_grad=learn)

    def effective(self) -> torch.Tensor:
        """``W diag(s) R`` (unquantized), the shape of the base weight."""
        w = self.base.weight
        if self.scale is not None:
            w = w * self.scale.view(1, -1, *([1] * (w.dim() - 2)))
        if self.rotation is not None:
            w = (w.movedim(1, -1) @ self.rotation).movedim(-1, 1)
        return w

    def quantize_weight(self, w: torch.Tensor, clip_search: bool = False) -> torch.Tensor:
        """Symmetric per-output-channel fake quantization of ``w [out, in, ...]`` (``w_bits = 16``: ``w``)."""
        if self.w_bits >= 16:
            return w
        flat = w.reshape(w.shape[0], -1)
        if clip_search:
            q = rtn_weight(flat, self.w_bits, clip_search=True, sym_scale=self.w_sym_scale)
        else:
            q = fake_quant(flat, self.w_bits, symmetric=True, sym_scale=self.w_sym_scale)
        return q.reshape(w.shape)

    @torch.no_grad()
    def freeze(self, clip_search: bool = False) -> None:
        """Fold the transforms into the weight and quantize it once (RTN)."""
        self.w_frozen = self.quantize_weight(self.effective().detach(), clip_search).clone()
        self.w_quant_on = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.movedim(1, -1) if self.conv else x  # channel-last: rows of the input dimension
        if self.record:
            a = h.detach().abs().reshape(-1, h.shape[-1]).amax(0)
            self.amax = a if self.amax is None else torch.maximum(self.amax, a)
        if self.scale is not None:
            h = h / self.scale
        if self.rotation is not None:
            h = h @ self.rotation
        h = self.act_quant(h)
        if self.w_frozen is not None:
            w = self.w_frozen
        else:
            w = self.effective()
            w = self.quantize_weight(w) if self.w_quant_on else w
        if self.conv:
            return self.base._conv_forward(h.movedim(-1, 1), w, self.base.bias)
        return F.linear(h, w, self.base.bias)


class QuantizedClassifier:
    """Every ``nn.Linear`` / ``nn.Conv2d`` of ``model`` swapped for a :class:`QLayer` until :meth:`detach`.

    Args:
        model: The classifier (modified in place; :meth:`detach` puts the original layers back).
        w_bits, a_bits: Weight / activation bits (2..8, or 16 = full precision).
        rotation: ``none`` or ``hadamard`` (a random Hadamard per transformable layer, seeded by ``seed``).
        learn: Linear layers get a trainable rotation and a trainable smoothing vector (OSTQuant).
        seed: Seed of the random Hadamard signs.
        w_sym_scale: Symmetric weight scale rule (``signed`` or ``absmax``).
        act_scale: ``token`` (dynamic per token, shared quantizer) or ``tensor`` (static per tensor, one calibrated
            quantizer per layer; see the module docstring).
    """

    def __init__(
        self,
        model: nn.Module,
        w_bits: int = 4,
        a_bits: int = 4,
        rotation: str = "none",
        learn: bool = False,
        seed: int = 0,
        w_sym_scale: str = "signed",
        act_scale: str = "token",
    ) -> None:
        if rotation not in ROTATIONS:
            raise ValueError(f"rotation={rotation!r} must be one of {ROTATIONS}")
        if act_scale not in ACT_SCALES:
            raise ValueError(f"act_scale={act_scale!r} must be one of {ACT_SCALES}")
        self.model = model
        self.act_quant = Quantizer(a_bits, symmetric=False, name="a_bits")
        self.layers: dict[str, QLayer] = {}
        self._swapped: list[tuple[nn.Module, str, nn.Module]] = []
        skip = {id(m) for mha in model.modules() if isinstance(mha, nn.MultiheadAttention) for m in mha.modules()}
        targets = [
            (name, m)
            for name, m in model.named_modules()
            if isinstance(m, (nn.Linear, nn.Conv2d)) and id(m) not in skip
        ]
        gen = torch.Generator().manual_seed(seed)
        for name, m in targets:
            aq = StaticQuantizer(a_bits) if act_scale == "tensor" else self.act_quant
            q = QLayer(m, aq, w_bits, w_sym_scale)
            if q.transformable and rotation == "hadamard":
                q.set_rotation(random_hadamard(q.n_in, gen, q.base.weight.dtype), learn=learn and not q.conv)
            if q.transformable and learn and not q.conv:
                q.set_scale(torch.ones(q.n_in), learn=True)
            self.layers[name] = q
        for name, q in self.layers.items():
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            self._swapped.append((parent, child, getattr(parent, child)))
            setattr(parent, child, q)
        self.set_quant(True)

    def detach(self) -> None:
        """Put the original layers back (the model is then exactly as it was)."""
        for parent, child, original in reversed(self._swapped):
            setattr(parent, child, original)
        self._swapped = []

    def rotation_parameters(self) -> list[nn.Parameter]:
        """The trainable rotations (linear layers under ``learn``)."""
        return [q.rotation for q in self.layers.values() if q.rotation is not None and q.rotation.requires_grad]

    def scale_parameters(self) -> list[nn.Parameter]:
        """The trainable smoothing vectors (linear layers under ``learn``)."""
        return [q.scale for q in self.layers.values() if q.scale is not None and q.scale.requires_grad]

    def set_quant(self, enabled: bool) -> None:
        """Switch activation quantization and the on-the-fly (training) weight quantization on or off."""
        self.act_quant.enabled = enabled
        for q in self.layers.values():
            q.act_quant.enabled = enabled
            q.w_quant_on = enabled and q.w_frozen is None

    @torch.no_grad()
    def smoothquant(self, forward, batches: list, alpha: float = 0.5) -> None:
        """SmoothQuant scales ``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` of every transformable layer, ``max|X_j|``
        over ``forward(batch)`` for ``batch`` in ``batches`` in full precision, ``max|W_j|`` over the weight's input
        channel ``j`` (all output channels and kernel taps)."""
        if not 0 <= alpha <= 1:
            raise ValueError(f"smoothquant alpha={alpha!r} must be in [0, 1]")
        todo = [q for q in self.layers.values() if q.transformable]
        self.set_quant(False)
        for q in todo:
            q.record, q.amax = True, None
        try:
            for batch in batches:
                forward(batch)
        finally:
            for q in todo:
                q.record = False
            self.set_quant(True)
        for q in todo:
            if q.amax is None:  # not on the forward path
                continue
            wmax = q.base.weight.detach().transpose(0, 1).reshape(q.n_in, -1).abs().amax(1)
            s = q.amax.clamp_min(1e-5) ** alpha / wmax.clamp_min(1e-5) ** (1 - alpha)
            q.set_scale(s.clamp_min(1e-5), learn=False)

    @torch.no_grad()
    def calibrate_activations(self, forward, batches: list) -> None:
        """Fix the range of every static per-tensor activation quantizer (``act_scale="tensor"``) to the min / max of
        its layer's transformed input ``(x / s) R`` over ``forward(batch)`` for ``batch`` in ``batches``, the model
        running with its current weights and full-precision activations. No-op for ``act_scale="token"``."""
        static = [q.act_quant for q in self.layers.values() if isinstance(q.act_quant, StaticQuantizer)]
        for a in static:
            a.reset()
            a.observing = True
        try:
            for batch in batches:
                forward(batch)
        finally:
            for a in static:
                a.observing = False

    @torch.no_grad()
    def freeze(self, clip_search: bool = False) -> None:
        """Fold every transform and quantize every weight once (RTN, per output channel)."""
        for p in self.rotation_parameters() + self.scale_parameters():
            p.requires_grad_(False)
        for q in self.layers.values():
            q.freeze(clip_search)
