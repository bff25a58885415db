"""Classifiers for the backdoor experiments: a small CNN (CPU scale) and a CIFAR-style ResNet-18 (paper scale).

Both expose ``features(x) -> [B, D]`` (penultimate activations, for Spectral Signatures / Activation Clustering)
and ``forward(x) -> [B, K]`` logits.
"""

from __future__ import annotations

import torch
from torch import nn

from core.errors import ConfigError

NETS = ("small_cnn", "resnet18")


class SmallCNN(nn.Module):
    """Two conv blocks (conv-BN-ReLU, pooled) and an MLP head. ``x``: ``[B, C, H, W]``."""

    def __init__(self, in_channels: int, num_classes: int, width: int = 32) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(2, ceil_mode=True),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
            nn.Flatten(),
            nn.Linear(2 * width * 16, 4 * width),
            nn.ReLU(),
        )
        self.head = nn.Linear(4 * width, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class ResNet18(nn.Module):
    """torchvision ResNet-18 with the CIFAR stem (3x3 stride-1 conv, no max-pool), as in the official code."""

    def __init__(self, in_channels: int, num_classes: int, width: int = 64) -> None:
        super().__init__()
        from torchvision.models import resnet18

        if width != 64:
            raise ConfigError(f"model.width={width}: resnet18 has a fixed width of 64")
        net = resnet18(num_classes=num_classes)
        net.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        net.maxpool = nn.Identity()
        self.head = net.fc
        net.fc = nn.Identity()
        self.trunk = net

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.trunk(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def build_net(name: str, in_channels: int, num_classes: int, width: int) -> nn.Module:
    """Instantiate a network from :data:`NETS`."""
    if name not in NETS:
        raise ConfigError(f"model.net={name!r} must be one of {list(NETS)}")
    if in_channels < 1 or num_classes < 2 or width < 1:
        raise ConfigError(
            f"model.in_channels={in_channels} (>= 1), model.num_classes={num_classes} (>= 2), model.width={width} "
            "(>= 1) out of range"
        )
    return (SmallCNN if name == "small_cnn" else ResNet18)(in_channels, num_classes, width)


def reset_parameters(net: nn.Module, seed: int) -> None:
    """Re-initialise every sub-module that can (weights and BN statistics), seeded: a fresh model in place."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for m in net.modules():
            if m is not net and hasattr(m, "reset_parameters"):
                m.reset_parameters()
