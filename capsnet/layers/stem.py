"""A small residual feature extractor (He et al. 2016's basic blocks) for capsule heads and
their linear baseline: a 3x3 stride-2 convolution, then stride-2 basic blocks whose width
doubles (up to ``max_width``) until the feature grid is at most ``feature_grid`` cells a side.
Its cost per image is a few tens of MFLOPs at 128 px: most of it at the smallest grids."""
from __future__ import annotations

import math

import torch
from torch import nn

STEM_KERNEL = 3


def halvings(image_size: int, feature_grid: int) -> int:
    """How many stride-2 steps (padding 1: ceil(n / 2)) bring ``image_size`` to at most
    ``feature_grid`` cells a side; at least 1 (the first convolution)."""
    steps, side = 0, image_size
    while side > feature_grid or steps == 0:
        side, steps = math.ceil(side / 2), steps + 1
    return steps


def grid_after(image_size: int, steps: int) -> int:
    """The side after ``steps`` stride-2 steps with padding 1."""
    for _ in range(steps):
        image_size = math.ceil(image_size / 2)
    return image_size


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut (a strided 1x1 where the shape
    changes). (B, C_in, H, W) -> (B, C_out, ceil(H / stride), ceil(W / stride))."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))  # (B, C_out, H', W')
        return torch.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResidualStem(nn.Module):
    """(B, C, S, S) -> features (B, out_channels, G, G), G = :attr:`grid` <= ``feature_grid``
    (1 when the image is that small already)."""

    def __init__(self, in_channels: int, image_size: int, width: int = 16, max_width: int = 256,
                 feature_grid: int = 8):
        super().__init__()
        steps = halvings(image_size, feature_grid)
        self.grid = grid_after(image_size, steps)
        self.first = nn.Sequential(
            nn.Conv2d(in_channels, width, STEM_KERNEL, 2, padding=1, bias=False),
            nn.BatchNorm2d(width), nn.ReLU())
        widths = [min(width * 2 ** (s + 1), max_width) for s in range(steps - 1)]
        blocks, channels = [], width
        for w in widths:
            blocks.append(BasicBlock(channels, w, stride=2))
            channels = w
        self.blocks = nn.Sequential(*blocks)
        self.out_channels = channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.first(x))  # (B, C', G, G)
