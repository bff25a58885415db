"""Building blocks shared by the token mixers: short causal convolution, rotary embedding, SwiGLU MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.errors import ConfigError


def check_positive(name: str, value: int) -> None:
    """Raise :class:`ConfigError` unless ``value`` is a positive int."""
    if not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}={value!r} must be a positive integer")


def split_heads(d_model: int, num_heads: int, head_dim: int | None, what: str) -> int:
    """Resolve the per-head size; without ``head_dim``, ``d_model`` must divide by ``num_heads``."""
    check_positive(f"{what}.num_heads", num_heads)
    if head_dim is None:
        if d_model % num_heads:
            raise ConfigError(f"{what}: d_model={d_model} must be divisible by num_heads={num_heads}")
        return d_model // num_heads
    check_positive(f"{what}.head_dim", head_dim)
    return head_dim


class ShortConvolution(nn.Module):
    """Depthwise causal 1-D convolution with SiLU (Gated DeltaNet §3.4, fla ``ShortConvolution``, kernel 4).

    Args:
        channels: Feature size ``C``.
        kernel_size: Taps; position ``t`` sees ``t - kernel_size + 1 .. t``.
        init_std: Draw the weights from ``N(0, init_std^2)`` (fla's model init uses 0.02); ``None`` keeps PyTorch's
            default (kaiming-uniform, bound ``1 / sqrt(kernel_size)``), which the NVlabs code keeps.
    """

    def __init__(self, channels: int, kernel_size: int = 4, init_std: float | None = None) -> None:
        super().__init__()
        check_positive("conv_size", kernel_size)
        if init_std is not None and not init_std > 0:
            raise ConfigError(f"conv_init_std={init_std!r} must be positive (or null for PyTorch's default init)")
        self.kernel_size = kernel_size
        self.conv = nn.Conv1d(channels, channels, kernel_size, groups=channels, padding=0, bias=False)
        if init_std is not None:
            nn.init.normal_(self.conv.weight, std=init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, C] -> [B, T, C]``, causal."""
        x = F.pad(x.transpose(1, 2), (self.kernel_size - 1, 0))
        return F.silu(self.conv(x)).transpose(1, 2)


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al.): rotate channel pairs ``(x_i, x_{i + D/2})`` by ``t * base^{-2i/D}``. No length limit.

    Args:
        dim: Head size ``D`` (even).
        base: Frequency base.
    """

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        if dim % 2:
            raise ConfigError(f"RoPE needs an even head_dim, got {dim}")
        self.register_buffer(
            "inv_freq", base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim), persistent=False
        )

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """``x [B, H, T, D]`` rotated by the absolute position ``offset + t``."""
        t = x.shape[-2]
        pos = torch.arange(offset, offset + t, device=x.device, dtype=torch.float32)
        ang = pos[:, None] * self.inv_freq[None, :]  # [T, D/2]
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class SwiGLU(nn.Module):
    """LLaMA MLP ``W_2 (silu(W_1 x) * W_3 x)`` (the channel mixer of every block).

    Args:
        d_model: Model width.
        hidden: Inner width.
    """

    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        check_positive("mlp hidden", hidden)
        self.gate_proj = nn.Linear(d_model, hidden, bias=False)
        self.up_proj = nn.Linear(d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, d_model] -> [B, T, d_model]``."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
