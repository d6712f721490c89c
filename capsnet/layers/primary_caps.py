"""The layers before the class capsules: how images meet the first convolution
(:class:`InputNorm`) and the primary capsules, a convolution whose output channels are
grouped into capsules (CapsNet's :class:`PrimaryCaps`, Efficient-CapsNet's
:class:`DepthwisePrimaryCaps`)."""
from __future__ import annotations

import math

import torch
from torch import nn

from capsnet.config import INPUT_NORMS, conv_output_size
from capsnet.layers.gemm_conv import GemmConv2d
from capsnet.squashing import exp_squash, full_precision, squash

FEATURE_MAP_NDIM = 4  # (B, C, H, W)


def standardise_images(x: torch.Tensor) -> torch.Tensor:
    """x (B, C, H, W) -> (B, C, H, W): per-channel mean zero, overall unit variance per image
    (the standard deviation floored at 1/sqrt(C*H*W), as tf.image.per_image_standardization)."""
    B, C, H, W = x.shape
    centred = x - x.mean(dim=(2, 3), keepdim=True)  # (B, C, H, W)
    spread = centred.flatten(1).std(dim=1, unbiased=False)  # (B,)
    floor = 1.0 / math.sqrt(C * H * W)
    return centred / spread.clamp_min(floor).view(B, 1, 1, 1)


class InputNorm(nn.Module):
    """Images as they are (``mode`` 'none', the paper) or each standardised ('image',
    :func:`standardise_images`), so that a dense coloured ground does not saturate every
    primary capsule alike. No parameters. (B, C, H, W) -> (B, C, H, W)."""

    def __init__(self, mode: str = "none"):
        super().__init__()
        if mode not in INPUT_NORMS:
            raise ValueError(f"unknown input_norm {mode!r}; choose from {', '.join(INPUT_NORMS)}")
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return standardise_images(x) if self.mode == "image" else x

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}"


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


class DepthwisePrimaryCaps(nn.Module):
    """Efficient-CapsNet's primary capsules (Mazzia et al. 2021, "Primary capsules"; the
    authors' utils/layers.py, class ``PrimaryCaps``): a ``kernel`` x ``kernel`` depthwise
    convolution (valid, stride 1) cut into capsules of ``dim`` channels, :func:`exp_squash`ed
    in float32. (B, C, H, W) -> (B, H' * W' * C / dim, dim), position-major as their Reshape."""

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
