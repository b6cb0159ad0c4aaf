"""The LeNet used by DLG (Zhu et al., "Deep Leakage from Gradients", NeurIPS 2019), MNIST variant (digest 004 P9):
three 5x5 convolutions with 12 channels, sigmoid activations, strides 2/2/1, then one linear layer 12*7*7 = 588 -> 10.
Sigmoid (twice differentiable everywhere) and the wide uniform initialisation are what make DLG work."""
from __future__ import annotations

import torch
from torch import nn


class LeNetDLG(nn.Module):
    def __init__(self, channels: int = 1, image_size: int = 28, num_classes: int = 10):
        super().__init__()
        if image_size < 4 or channels < 1 or num_classes < 2:
            raise ValueError(f"need image_size >= 4, channels >= 1, num_classes >= 2; got {image_size}, {channels}, "
                             f"{num_classes}")
        self.body = nn.Sequential(
            nn.Conv2d(channels, 12, kernel_size=5, padding=2, stride=2), nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=2), nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=1), nn.Sigmoid(),
        )
        side = (((image_size + 1) // 2) + 1) // 2
        self.fc = nn.Linear(12 * side * side, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.body(x).flatten(1))


def init_uniform_(model: nn.Module, generator: torch.Generator, bound: float = 0.5) -> nn.Module:
    """Every weight and bias ~ U(-bound, bound), as DLG's reference code initialises its LeNet."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=generator, dtype=p.dtype) * (2 * bound) - bound)
    return model


def build_lenet(generator: torch.Generator, channels: int = 1, image_size: int = 28, num_classes: int = 10
                ) -> LeNetDLG:
    return init_uniform_(LeNetDLG(channels, image_size, num_classes), generator)
