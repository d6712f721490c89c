"""PrimaryCaps: a convolution whose output channels are grouped into capsules."""
from __future__ import annotations

import torch
from torch import nn

from capsnet.config import conv_output_size
from capsnet.layers.gemm_conv import GemmConv2d
from capsnet.squashing import full_precision, squash

FEATURE_MAP_NDIM = 4  # (B, C, H, W)


class PrimaryCaps(nn.Module):
    """``types`` capsule types of ``dim`` dimensions on a conv grid, squashed in float32.
    (B, C_in, H, W) -> (B, types * H' * W', dim), type-major (the paper's 32 x 6 x 6 = 1152)."""

    def __init__(self, in_channels: int, types: int, dim: int, kernel: int, stride: int):
        super().__init__()
        self.in_channels, self.types, self.dim = in_channels, types, dim
        self.kernel, self.stride = kernel, stride
        self.conv = GemmConv2d(in_channels, types * dim, kernel_size=kernel, stride=stride)

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """(H', W'): the capsule grid for input maps of height x width (6 x 6 for 20 x 20)."""
        return (conv_output_size(height, self.kernel, self.stride),
                conv_output_size(width, self.kernel, self.stride))

    def num_capsules(self, height: int, width: int | None = None) -> int:
        """Capsules out for height x width input maps: the next DigitCaps' ``in_caps``."""
        rows, columns = self.grid(height, height if width is None else width)
        if rows < 1 or columns < 1:
            raise ValueError(f"PrimaryCaps with kernel {self.kernel} needs input maps of at "
                             f"least {self.kernel}x{self.kernel}, got {height}x{width or height}")
        return self.types * rows * columns

    def check_input(self, x: torch.Tensor) -> None:
        """ValueError in one line unless x is (B, in_channels, H, W) with H, W >= kernel."""
        if x.dim() != FEATURE_MAP_NDIM or x.shape[1] != self.in_channels:
            raise ValueError(f"PrimaryCaps expects feature maps (B, {self.in_channels}, H, W), "
                             f"got {tuple(x.shape)}")
        if min(x.shape[-2:]) < self.kernel:
            raise ValueError(f"PrimaryCaps with kernel {self.kernel} needs input maps of at "
                             f"least {self.kernel}x{self.kernel}, got "
                             f"{x.shape[-2]}x{x.shape[-1]}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        B = x.shape[0]
        out = self.conv(x)  # (B, types*dim, H', W')
        rows, columns = out.shape[-2:]
        u = out.view(B, self.types, self.dim, rows, columns)  # (B, 32, 8, 6, 6)
        u = u.permute(0, 1, 3, 4, 2)  # (B, 32, 6, 6, 8)
        u = u.reshape(B, self.types * rows * columns, self.dim)  # (B, 1152, 8)
        return squash(full_precision(u))
