"""EDM preconditioning (Karras et al. 2022, Table 1 / Eq. (7)): D(x, sigma) = c_skip x + c_out F(c_in x, c_noise)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from core.errors import ConfigError


class EDMPrecond(nn.Module):
    """Wraps a raw network F(x, c_noise) into the denoiser D(x, sigma).

    c_skip = s_d^2 / (sigma^2 + s_d^2), c_out = sigma s_d / sqrt(sigma^2 + s_d^2), c_in = 1 / sqrt(sigma^2 + s_d^2),
    c_noise = log(sigma) / 4.

    Args:
        net: F(x [B, ...], c_noise [B]) -> [B, ...].
        sigma_data: Data standard deviation s_d.
    """

    def __init__(self, net: nn.Module, sigma_data: float = 0.5) -> None:
        super().__init__()
        if sigma_data <= 0:
            raise ConfigError(f"sigma_data={sigma_data} must be > 0")
        self.net, self.sigma_data = net, sigma_data

    def forward(self, x: Tensor, sigma: Tensor, **cond: Tensor) -> Tensor:
        """x [B, ...], sigma [B] (>= 0) -> D [B, ...]; ``cond`` (e.g. ``cond_image``, ``cond``) goes to F unscaled."""
        if bool((sigma < 0).any()):
            raise ConfigError(f"sigma={float(sigma.min())} must be >= 0")
        shape = (-1,) + (1,) * (x.ndim - 1)
        s = sigma.to(x.dtype).reshape(shape)
        sd2 = self.sigma_data**2
        c_skip = sd2 / (s**2 + sd2)
        c_out = s * self.sigma_data / torch.sqrt(s**2 + sd2)
        c_in = 1.0 / torch.sqrt(s**2 + sd2)
        c_noise = torch.log(sigma.to(x.dtype).clamp_min(1e-20)) / 4
        return c_skip * x + c_out * self.net(c_in * x, c_noise, **cond)

    def loss_weight(self, sigma: Tensor) -> Tensor:
        """lambda(sigma) = (sigma^2 + s_d^2) / (sigma s_d)^2 (Karras et al. 2022, Eq. (8) and Table 1)."""
        return (sigma**2 + self.sigma_data**2) / (sigma * self.sigma_data) ** 2
