"""Efficient-CapsNet's primary capsules: a depthwise convolution whose channels are grouped
into capsules, squashed by :func:`exp_squash` (Mazzia et al. 2021, Methods, "Primary
capsules"; public code: EscVM/Efficient-CapsNet, utils/layers.py, class ``PrimaryCaps``)."""
from __future__ import annotations

import torch
from torch import nn

from capsnet.squashing import exp_squash, full_precision


class DepthwisePrimaryCaps(nn.Module):
    """A ``kernel`` x ``kernel`` depthwise convolution (valid, stride 1) cut into capsules of
    ``dim`` channels, squashed in float32.
    (B, C, H, W) -> (B, H' * W' * C / dim, dim), position-major as the authors' Reshape."""

    def __init__(self, channels: int, dim: int, kernel: int):
        super().__init__()
        if channels % dim:
            raise ValueError(f"{channels} channels do not make capsules of {dim} dimensions")
        self.dim = dim
        self.conv = nn.Conv2d(channels, channels, kernel, groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        out = self.conv(x)  # (B, 128, 1, 1)
        u = out.permute(0, 2, 3, 1).reshape(B, -1, self.dim)  # (B, 16, 8)
        return exp_squash(full_precision(u))
