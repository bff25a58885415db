"""Forecasting backbones of TS-LIF: spiking GRU-cell encoder, spiking TCN, and a non-spiking GRU reference.

All three are channel-independent (iTransformer/PatchTST style): each variate's window is a sequence of ``L``
scalars, encoded to ``H`` channels, so weights do not depend on the number of variates ``C``.

* Instance normalisation (Eq. (14)): ``x' = (x - mean_t x) / std_t x`` per sample and variate, undone on the output.
* Conv encoder (Eq. (15)): ``Conv2d(1 -> H, kernel 1x3) + BatchNorm`` over ``[B, 1, C, L]``, then a one-step LIF
  from rest (``snntorch.Leaky(beta=0.99)`` with zero membrane fires ``H(e - theta)``).
* Spiking GRU cell (Eq. (16)): the official ``ITSSNNGRU2D`` calls the cell with a **zero hidden state at every
  step**, gates are Heaviside (ATan surrogate): ``r = H(W_r x + b_r)``, ``z = H(W_z x + b_z)``,
  ``n = H(W_n x + b_in + r * b_hn)``, ``h = (1 - z) * n``. All recurrence lives in the neuron that follows.
* Head (Eq. (17)): the neuron output at the last step, ``Linear(H -> horizon)``, denormalised.
* Spiking TCN: the encoder output repeated ``num_steps`` times (rate coding, as ``spike_tcn.py``), causal dilated
  ``Conv1d`` blocks each followed by the neuron over the repeat axis, averaged over the repeats.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from core.errors import ConfigError
from layers.spiking.surrogate import spike


class InstanceNorm(nn.Module):
    """Per-sample, per-variate normalisation over time (Eq. (14)); ``denorm`` undoes it on the forecast."""

    def __init__(self, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [B, L, C]`` -> ``(x_norm [B, L, C], mean [B, 1, C], std [B, 1, C])``."""
        mean = x.mean(1, keepdim=True)
        std = torch.sqrt(x.var(1, keepdim=True, unbiased=False) + self.eps)
        return (x - mean) / std, mean, std

    @staticmethod
    def denorm(y: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        """``y [B, h, C]`` back to the input scale."""
        return y * std + mean


class ConvEncoder(nn.Module):
    """``[B, L, C] -> [B*C, L, H]``: Conv2d(1 -> H, 1x3) + BN (Eq. (15)), then spikes ``H(e - theta)`` if spiking."""

    def __init__(self, hidden: int, spiking: bool = True, theta: float = 1.0, alpha: float = 2.0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, hidden, kernel_size=(1, 3), padding=(0, 1))
        self.bn = nn.BatchNorm2d(hidden)
        self.spiking, self.theta, self.alpha = spiking, theta, alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, c = x.shape
        e = self.bn(self.conv(x.transpose(1, 2).unsqueeze(1)))  # [B, H, C, L]
        e = e.permute(0, 2, 3, 1).reshape(b * c, length, -1)  # [B*C, L, H]
        return spike(e - self.theta, self.alpha) if self.spiking else e


class SpikingGRUGates(nn.Module):
    """The official spiking GRU cell with zero hidden state (Eq. (16)), for all steps at once.

    ``forward`` is the fast path (one matmul over ``[N, L, H]``); ``naive_forward`` calls the literal cell step by
    step with ``h_prev = 0`` (including the ``W_h h_prev`` term), its parity twin.
    """

    def __init__(self, hidden: int, alpha: float = 2.0) -> None:
        super().__init__()
        self.w_i = nn.Linear(hidden, 3 * hidden)  # W_ir, W_iz, W_in with b_ir, b_iz, b_in
        # b_hr, b_hz, b_hn: with h = 0 only the hidden biases of nn.GRUCell act (W_h h = 0), so W_h is not kept.
        bound = hidden**-0.5
        self.b_h = nn.Parameter(torch.empty(3 * hidden).uniform_(-bound, bound))
        self.alpha = alpha

    def cell(self, x: torch.Tensor, h: torch.Tensor, w_h: torch.Tensor) -> torch.Tensor:
        """One literal GRU step with Heaviside gates: ``x, h [N, H]``, ``w_h [3H, H]`` -> ``h' [N, H]``."""
        gi_r, gi_z, gi_n = self.w_i(x).chunk(3, -1)
        gh_r, gh_z, gh_n = (h @ w_h.T + self.b_h).chunk(3, -1)
        r = spike(gi_r + gh_r, self.alpha)
        z = spike(gi_z + gh_z, self.alpha)
        n = spike(gi_n + r * gh_n, self.alpha)
        return (1 - z) * n + z * h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [N, L, H] -> h [N, L, H]`` with the hidden state zero at every step."""
        gi_r, gi_z, gi_n = self.w_i(x).chunk(3, -1)
        b_r, b_z, b_n = self.b_h.chunk(3)
        r = spike(gi_r + b_r, self.alpha)
        z = spike(gi_z + b_z, self.alpha)
        n = spike(gi_n + r * b_n, self.alpha)
        return (1 - z) * n

    def naive_forward(self, x: torch.Tensor, w_h: torch.Tensor | None = None) -> torch.Tensor:
        """Step-by-step twin of :meth:`forward`: the literal cell with ``h_prev = 0`` (any ``w_h`` gives the same)."""
        zero = torch.zeros_like(x[:, 0])
        w_h = torch.zeros(3 * x.shape[-1], x.shape[-1], dtype=x.dtype) if w_h is None else w_h
        return torch.stack([self.cell(x[:, t], zero, w_h) for t in range(x.shape[1])], 1)


class SpikingGRUBackbone(nn.Module):
    """Conv encoder -> spiking GRU gates -> neuron over the ``L`` steps -> last step: ``[B, L, C] -> [B, C, H]``."""

    def __init__(self, hidden: int, neuron: nn.Module, theta: float = 1.0, alpha: float = 2.0) -> None:
        super().__init__()
        self.encoder = ConvEncoder(hidden, spiking=True, theta=theta, alpha=alpha)
        self.gates = SpikingGRUGates(hidden, alpha)
        self.neuron = neuron

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, c = x.shape
        y = self.neuron(self.gates(self.encoder(x)))  # [B*C, L, H]
        return y[:, -1].reshape(b, c, -1)


class SpikingTCNBackbone(nn.Module):
    """Spiking TCN: encoder output repeated ``num_steps`` times; ``levels`` causal dilated Conv1d + BN blocks, each
    followed by a neuron over the repeat axis, with residuals; mean over repeats, last position: ``[B, C, H]``."""

    def __init__(
        self,
        hidden: int,
        neuron_factory: Callable[[], nn.Module],
        num_steps: int = 4,
        levels: int = 2,
        kernel_size: int = 3,
        theta: float = 1.0,
        alpha: float = 2.0,
    ) -> None:
        super().__init__()
        if num_steps < 1 or levels < 1 or kernel_size < 1:
            raise ConfigError(
                f"model.num_steps={num_steps}, model.tcn_levels={levels}, model.tcn_kernel={kernel_size} must be >= 1"
            )
        self.encoder = ConvEncoder(hidden, spiking=True, theta=theta, alpha=alpha)
        self.num_steps = num_steps
        self.convs = nn.ModuleList(
            nn.Conv1d(hidden, hidden, kernel_size, dilation=2**i, padding=0) for i in range(levels)
        )
        self.bns = nn.ModuleList(nn.BatchNorm1d(hidden) for _ in range(levels))
        self.neurons = nn.ModuleList(neuron_factory() for _ in range(levels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, c = x.shape
        e = self.encoder(x)  # [N, L, H]
        n, _, h = e.shape
        z = e.unsqueeze(1).expand(n, self.num_steps, length, h)  # [N, T, L, H]
        for conv, bn, neuron in zip(self.convs, self.bns, self.neurons):
            pad = (conv.kernel_size[0] - 1) * conv.dilation[0]
            u = z.reshape(n * self.num_steps, length, h).transpose(1, 2)  # [N*T, H, L]
            u = bn(conv(nn.functional.pad(u, (pad, 0))))  # causal
            u = u.transpose(1, 2).reshape(n, self.num_steps, length, h)
            z = neuron(u) + z  # neuron over the repeat axis T, per position and channel
        return z.mean(1)[:, -1].reshape(b, c, h)


class GRUReferenceBackbone(nn.Module):
    """Non-spiking reference: continuous conv encoder -> ``nn.GRU`` over the window -> last hidden ``[B, C, H]``."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.encoder = ConvEncoder(hidden, spiking=False)
        self.gru = nn.GRU(hidden, hidden, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, c = x.shape
        out, _ = self.gru(self.encoder(x))
        return out[:, -1].reshape(b, c, -1)


class Forecaster(nn.Module):
    """Instance norm -> backbone -> ``Linear(H -> horizon)`` -> denorm (Eqs. (14), (17)): ``[B, L, C] -> [B, h, C]``."""

    def __init__(self, backbone: nn.Module, hidden: int, horizon: int, instance_norm: bool = True) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden, horizon)
        self.norm = InstanceNorm() if instance_norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            x, mean, std = self.norm(x)
        y = self.head(self.backbone(x)).transpose(1, 2)  # [B, h, C]
        return InstanceNorm.denorm(y, mean, std) if self.norm is not None else y
