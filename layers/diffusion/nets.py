"""Raw networks F(x, c_noise) for :class:`layers.diffusion.precond.EDMPrecond`: an MLP for vectors and a small U-Net
for images. Noise conditioning uses Fourier features of c_noise (Karras et al. 2022, App. B)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from core.errors import ConfigError


class FourierEmbedding(nn.Module):
    """c_noise [B] -> [B, dim] with fixed random frequencies (sin, cos)."""

    def __init__(self, dim: int, scale: float = 16.0, seed: int = 0) -> None:
        super().__init__()
        if dim < 2 or dim % 2:
            raise ConfigError(f"embedding dim={dim} must be an even number >= 2")
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("freqs", torch.randn(dim // 2, generator=g) * scale)

    def forward(self, c: Tensor) -> Tensor:
        arg = 2 * math.pi * c[:, None].to(self.freqs.dtype) * self.freqs[None]
        return torch.cat([torch.sin(arg), torch.cos(arg)], dim=1)


class MLPDenoiser(nn.Module):
    """MLP F(x [B, d], c_noise [B]) -> [B, d] with the noise embedding concatenated to the input.

    Args:
        dim: Data dimension d.
        hidden: Width.
        depth: Number of hidden layers.
        emb_dim: Noise-embedding width.
    """

    def __init__(self, dim: int, hidden: int = 128, depth: int = 3, emb_dim: int = 32) -> None:
        super().__init__()
        if dim < 1 or hidden < 1 or depth < 1:
            raise ConfigError(f"MLPDenoiser needs dim, hidden, depth >= 1, got {dim}, {hidden}, {depth}")
        self.embed = FourierEmbedding(emb_dim, scale=1.0)
        layers: list[nn.Module] = []
        width = dim + emb_dim
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.SiLU()]
            width = hidden
        layers.append(nn.Linear(width, dim))
        self.body = nn.Sequential(*layers)

    def forward(self, x: Tensor, c_noise: Tensor) -> Tensor:
        return self.body(torch.cat([x, self.embed(c_noise).to(x.dtype)], dim=1))


class ResBlock(nn.Module):
    """GroupNorm-SiLU-conv residual block with an additive noise embedding."""

    def __init__(self, c_in: int, c_out: int, emb_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(min(8, c_in), c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.emb = nn.Linear(emb_dim, c_out)
        self.norm2 = nn.GroupNorm(min(8, c_out), c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1)
        self.skip = nn.Conv2d(c_in, c_out, 1) if c_in != c_out else nn.Identity()

    def forward(self, x: Tensor, emb: Tensor) -> Tensor:
        h = self.conv1(nn.functional.silu(self.norm1(x)))
        h = h + self.emb(emb)[:, :, None, None]
        h = self.conv2(nn.functional.silu(self.norm2(h)))
        return h + self.skip(x)


class SmallUNet(nn.Module):
    """Two-level U-Net F(x [B, C, H, W], c_noise [B]) -> [B, C, H, W]; H and W must be even.

    Conditional use (addp): ``cond_channels`` > 0 concatenates a conditioning image ``cond_image [B, C_c, H, W]`` to
    the input (Marigold / InstructPix2Pix style), and ``cond_dim`` > 0 adds a linear projection of a conditioning
    vector ``cond [B, cond_dim]`` (an expression embedding) to the noise embedding, which every block receives.

    Args:
        in_channels: Image channels C.
        channels: Base width (doubled at the lower level).
        emb_dim: Noise-embedding width.
        cond_channels: Channels of the concatenated conditioning image (0: none).
        cond_dim: Width of the conditioning vector (0: none).
    """

    def __init__(
        self, in_channels: int = 1, channels: int = 32, emb_dim: int = 64, cond_channels: int = 0, cond_dim: int = 0
    ) -> None:
        super().__init__()
        if in_channels < 1 or channels < 1:
            raise ConfigError(f"SmallUNet needs in_channels, channels >= 1, got {in_channels}, {channels}")
        if cond_channels < 0 or cond_dim < 0:
            raise ConfigError(f"SmallUNet needs cond_channels, cond_dim >= 0, got {cond_channels}, {cond_dim}")
        self.cond_channels, self.cond_dim = cond_channels, cond_dim
        self.embed = nn.Sequential(FourierEmbedding(emb_dim, scale=1.0), nn.Linear(emb_dim, emb_dim), nn.SiLU())
        self.cond_proj = nn.Sequential(nn.Linear(cond_dim, emb_dim), nn.SiLU()) if cond_dim else None
        c1, c2 = channels, 2 * channels
        self.inp = nn.Conv2d(in_channels + cond_channels, c1, 3, padding=1)
        self.down1 = ResBlock(c1, c1, emb_dim)
        self.pool = nn.AvgPool2d(2)
        self.down2 = ResBlock(c1, c2, emb_dim)
        self.mid = ResBlock(c2, c2, emb_dim)
        self.up2 = ResBlock(c2 + c2, c1, emb_dim)
        self.up1 = ResBlock(c1 + c1, c1, emb_dim)
        self.out = nn.Sequential(nn.GroupNorm(min(8, c1), c1), nn.SiLU(), nn.Conv2d(c1, in_channels, 3, padding=1))

    def forward(
        self, x: Tensor, c_noise: Tensor, cond_image: Tensor | None = None, cond: Tensor | None = None
    ) -> Tensor:
        if x.shape[-1] % 2 or x.shape[-2] % 2:
            raise ConfigError(f"SmallUNet needs even H, W, got {tuple(x.shape[-2:])}")
        e = self.embed(c_noise.to(x.dtype))
        if self.cond_proj is not None:
            if cond is None or cond.shape[-1] != self.cond_dim:
                got = None if cond is None else tuple(cond.shape)
                raise ConfigError(f"SmallUNet expects a condition embedding [B, {self.cond_dim}], got {got}")
            e = e + self.cond_proj(cond.to(x.dtype))
        if self.cond_channels:
            if cond_image is None or cond_image.shape[1] != self.cond_channels:
                got = None if cond_image is None else tuple(cond_image.shape)
                raise ConfigError(f"SmallUNet expects a condition image [B, {self.cond_channels}, H, W], got {got}")
            x = torch.cat([x, cond_image.to(x.dtype)], dim=1)
        h0 = self.down1(self.inp(x), e)
        h1 = self.down2(self.pool(h0), e)
        h = self.mid(h1, e)
        h = self.up2(torch.cat([h, h1], 1), e)
        h = nn.functional.interpolate(h, scale_factor=2, mode="nearest")
        h = self.up1(torch.cat([h, h0], 1), e)
        return self.out(h)
