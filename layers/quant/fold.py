"""Fold every eval-mode BatchNorm into the convolution that feeds it, reversibly, before weight quantization.

:class:`FoldedBatchNorm` finds the pairs by running the model once (forward hooks): a ``nn.BatchNorm2d`` whose input
is the very tensor a ``nn.Conv2d`` returned (a SmallCNN's ``conv -> BN`` in a ``Sequential`` and a ResNet's ``conv1``
/ ``bn1`` attributes alike). It then swaps each such convolution for a copy with the folded weight and bias
(:func:`ops.quant.static.fold_batchnorm`) and the BatchNorm for ``nn.Identity``; :meth:`FoldedBatchNorm.restore` puts
the originals back. A convolution whose output also feeds something other than its BatchNorm would change that other
consumer, so the model's outputs are compared before and after folding on the probe input and a mismatch raises.
The weight quantizer then sees ``W * gamma / sqrt(var + eps)``, the weight a deployed integer convolution holds.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from ops.quant.static import fold_batchnorm


class FoldedBatchNorm:
    """Fold the BatchNorms of ``model`` (in eval mode) into their convolutions until :meth:`restore`.

    Args:
        model: The classifier (modified in place).
        forward: Runs ``model`` once on a probe input and returns its output (finds the pairs and checks the fold).
        rtol: Relative tolerance of the check (float32 folding reorders a few roundings).

    Attributes:
        pairs: ``(conv name, BatchNorm name)`` of every fold.
    """

    def __init__(self, model: nn.Module, forward: Any, rtol: float = 1e-4) -> None:
        self.model = model
        self._swapped: list[tuple[nn.Module, str, nn.Module]] = []
        names = {m: n for n, m in model.named_modules()}
        produced: dict[int, tuple[str, torch.Tensor]] = {}  # id(output) -> (conv name, output kept alive)
        found: list[tuple[str, str]] = []

        def conv_hook(m, i, o):
            produced[id(o)] = (names[m], o)

        def bn_hook(m, i):
            src = produced.get(id(i[0]))
            taken = {n for pair in found for n in pair}
            if src is not None and src[1] is i[0] and names[m] not in taken and src[0] not in taken:
                found.append((src[0], names[m]))

        handles = [m.register_forward_hook(conv_hook) for m in model.modules() if isinstance(m, nn.Conv2d)]
        handles += [m.register_forward_pre_hook(bn_hook) for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
        try:
            with torch.no_grad():
                before = forward()
        finally:
            for h in handles:
                h.remove()
        produced.clear()
        self.pairs = found
        for conv_name, bn_name in found:
            conv, bn = model.get_submodule(conv_name), model.get_submodule(bn_name)
            if bn.training or not bn.track_running_stats or bn.running_mean is None:
                continue  # a BatchNorm on batch statistics is not a fixed affine map
            folded = copy.deepcopy(conv)
            with torch.no_grad():
                w, b = fold_batchnorm(
                    conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.weight, bn.bias, bn.eps
                )
                folded.weight = nn.Parameter(w.clone(), requires_grad=conv.weight.requires_grad)
                folded.bias = nn.Parameter(b.clone(), requires_grad=conv.weight.requires_grad)
            self._swap(conv_name, folded)
            self._swap(bn_name, nn.Identity())
        if self._swapped:
            with torch.no_grad():
                after = forward()
            scale = before.detach().abs().amax().clamp_min(1e-12)
            err = float((after.detach() - before.detach()).abs().amax() / scale)
            if not err <= rtol:
                self.restore()
                raise ValueError(
                    f"folding BatchNorm into {found} changes the model's output ({err:.2e} relative): "
                    "a folded convolution's output also feeds another layer"
                )

    def _swap(self, name: str, new: nn.Module) -> None:
        parent_name, _, child = name.rpartition(".")
        parent = self.model.get_submodule(parent_name) if parent_name else self.model
        self._swapped.append((parent, child, getattr(parent, child)))
        setattr(parent, child, new)

    def restore(self) -> None:
        """Put the original convolutions and BatchNorms back."""
        for parent, child, original in reversed(self._swapped):
            setattr(parent, child, original)
        self._swapped = []
