"""PrimaryCaps: a convolution whose output channels are grouped into capsules."""
from __future__ import annotations

import torch
from torch import nn

from capsnet.layers.gemm_conv import GemmConv2d
from capsnet.layers.squash import full_precision, squash


class PrimaryCaps(nn.Module):
    """``types`` capsule types of ``dim`` dimensions on a conv grid, squashed.

    Input (B, C_in, H, W). Output (B, types * H' * W', dim): one row per capsule,
    ordered type-major (type, row, column), as in the paper's 32 x 6 x 6 = 1152.
    The convolution may run in bf16 under autocast; the capsules are squashed in float32.
    """

    def __init__(self, in_channels: int, types: int, dim: int, kernel: int, stride: int):
        super().__init__()
        self.types, self.dim = types, dim
        self.conv = GemmConv2d(in_channels, types * dim, kernel_size=kernel, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        out = self.conv(x)  # (B, types*dim, G, G)
        G = out.shape[-1]
        u = out.view(B, self.types, self.dim, G, G)  # (B, 32, 8, 6, 6)
        u = u.permute(0, 1, 3, 4, 2).reshape(B, self.types * G * G, self.dim)  # (B, 1152, 8)
        return squash(full_precision(u))
