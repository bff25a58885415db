"""Feature extractor for an in-suite FID (no Inception weights offline): a small CNN classifier whose penultimate
activations are the FID features. It is trained in the suite on the same image data's labels."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class FeatureNet(nn.Module):
    """CNN x [B, C, H, W] in [-1, 1] -> features [B, num_features]; ``classify`` adds a linear head.

    Args:
        in_channels: Image channels.
        num_classes: Classes of the training labels.
        num_features: Feature width (the FID dimension).
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10, num_features: int = 64) -> None:
        super().__init__()
        self.num_features = num_features
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(256, num_features),
            nn.ReLU(),
        )
        self.head = nn.Linear(num_features, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.body(x.float())

    def classify(self, x: Tensor) -> Tensor:
        return self.head(self.forward(x))


def train_feature_net(net: FeatureNet, batches, steps: int, lr: float = 1e-3) -> float:
    """Train ``net`` as a classifier on (image [-1, 1], label) batches for ``steps`` steps; returns the last loss."""
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    loss = torch.tensor(float("nan"))
    it = iter(())
    with torch.enable_grad():
        for _ in range(steps):
            try:
                x, y = next(it)
            except StopIteration:
                it = iter(batches())
                x, y = next(it)
            loss = nn.functional.cross_entropy(net.classify(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return float(loss.detach())
