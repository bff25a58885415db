"""Static per-tensor activation quantization and BatchNorm folding: the post-training setting of SmoothQuant (its
static W8A8 scheme) and of the CNN PTQ literature, where one activation scale per layer input is calibrated once on
clean data and BatchNorm is folded into the preceding convolution before its weight is quantized.

* :func:`tensor_range`: the range ``[min(x, 0), max(x, 0)]`` of a whole tensor (every token and channel together).
* :func:`fake_quant_range`: asymmetric ``b``-bit fake quantization of ``x`` with a *given* range (scalars ``lo <= 0
  <= hi``): ``s = (hi - lo) / (2^b - 1)``, ``z = round(-lo / s)``, ``x_q = (clamp(round(x / s) + z, 0, 2^b - 1) - z)
  s``. Entries outside the range are clipped to it; the round is straight-through.
* :class:`StaticQuantizer`: observes the range of its inputs over calibration batches (min / max, the MinMax
  observer), then quantizes every later input with that one fixed range. Before any calibration it quantizes each
  input with the input's own per-tensor range (dynamic per-tensor), the setting transforms are learned under.
* :func:`fold_batchnorm`: ``W' = W * g``, ``b' = (b - mu) * g + beta`` with ``g = gamma / sqrt(var + eps)`` (per
  output channel), so that ``conv_{W', b'}(x) = BN(conv_{W, b}(x))`` in eval mode.

Contrast with :func:`ops.quant.fake_quant` (dynamic per token: a range per row, from the input itself), under which
an outlier in one token never coarsens the grid of the others; under a static per-tensor scale it does, for every
input, which is the damage SmoothQuant and OSTQuant set out to remove.
"""

from __future__ import annotations

import torch

from ops.quant.fake import check_bits, round_ste


def tensor_range(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lo, hi)``: scalars ``min(x.min(), 0)`` and ``max(x.max(), 0)`` over every entry of ``x`` (detached)."""
    x = x.detach()
    return x.amin().clamp(max=0), x.amax().clamp(min=0)


def fake_quant_range(x: torch.Tensor, lo: torch.Tensor | float, hi: torch.Tensor | float, bits: int) -> torch.Tensor:
    """Asymmetric ``bits``-bit quantize-dequantize of ``x`` (any shape) on the fixed range ``[lo, hi]`` (module doc).

    Args:
        x: Any tensor.
        lo, hi: Scalars with ``lo <= 0 <= hi`` (clamped so); one grid for every entry of ``x``.
        bits: Bit width in 2..8.

    Returns:
        Same shape and dtype as ``x``; entries outside ``[lo, hi]`` land on the end levels.
    """
    check_bits("bits", bits)
    lo = torch.as_tensor(lo, dtype=x.dtype, device=x.device).clamp(max=0)
    hi = torch.as_tensor(hi, dtype=x.dtype, device=x.device).clamp(min=0)
    qmax = 2**bits - 1
    s = ((hi - lo) / qmax).clamp_min(1e-8)
    z = torch.round(-lo / s)
    return (torch.clamp(round_ste(x / s) + z, 0, qmax) - z) * s


class StaticQuantizer:
    """One layer input's static per-tensor activation quantizer (module docstring); ``bits >= 16`` is the identity.

    Usage: ``q.observing = True``, run the calibration batches through the layer (inputs pass unchanged while their
    range is recorded), ``q.observing = False``; from then on ``q(x)`` uses the recorded range.

    Args:
        bits: 2..8, or 16 (off).

    Attributes:
        lo, hi: The calibrated range (``None`` before calibration).
        enabled: Quantize at all (``False``: the identity, as :class:`ops.quant.Quantizer`).
        observing: Record the range of the inputs instead of quantizing them.
    """

    def __init__(self, bits: int = 16) -> None:
        if bits != 16:
            check_bits("a_bits", bits)
        self.bits = bits
        self.lo: torch.Tensor | None = None
        self.hi: torch.Tensor | None = None
        self.enabled, self.observing = True, False

    def reset(self) -> None:
        """Forget the calibrated range."""
        self.lo = self.hi = None

    def observe(self, x: torch.Tensor) -> None:
        """Widen the recorded range to cover every entry of ``x``."""
        lo, hi = tensor_range(x)
        self.lo = lo if self.lo is None else torch.minimum(self.lo, lo)
        self.hi = hi if self.hi is None else torch.maximum(self.hi, hi)

    @property
    def calibrated(self) -> bool:
        return self.lo is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.observing:
            self.observe(x)
            return x
        if self.bits >= 16 or not self.enabled:
            return x
        lo, hi = (self.lo, self.hi) if self.calibrated else tensor_range(x)
        return fake_quant_range(x, lo, hi, self.bits)


def fold_batchnorm(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    running_mean: torch.Tensor,
    running_var: torch.Tensor,
    gamma: torch.Tensor | None,
    beta: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold an eval-mode BatchNorm into the convolution (or linear) before it.

    Args:
        weight: ``W [C_out, ...]`` of the convolution.
        bias: ``b [C_out]`` or ``None`` (zero).
        running_mean, running_var: The BatchNorm's ``mu``, ``var`` ``[C_out]``.
        gamma, beta: Its affine ``[C_out]`` (``None``: 1 and 0, ``affine=False``).
        eps: Its ``eps``.

    Returns:
        ``(W', b')`` with ``W' = W * g`` per output channel and ``b' = (b - mu) * g + beta``, ``g = gamma / sqrt(var
        + eps)``.
    """
    g = torch.rsqrt(running_var + eps)
    if gamma is not None:
        g = g * gamma
    b = torch.zeros_like(running_mean) if bias is None else bias
    b = (b - running_mean) * g
    if beta is not None:
        b = b + beta
    return weight * g.view(-1, *([1] * (weight.dim() - 1))), b
