"""Batch preparation on the training device: scaling, the paper's random shifts, crops."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def random_shift(images: torch.Tensor, max_shift: int,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Each image (B, C, H, W) shifted by up to ``max_shift`` pixels in x and y (uniform,
    independent), zero fill, by one gather."""
    if max_shift <= 0:
        return images
    padded = F.pad(images, (max_shift,) * 4)  # (B, C, H + 2s, W + 2s)
    return random_crop(padded, images.shape[-2], generator, images.shape[-1])  # (B, C, H, W)


def random_crop(images: torch.Tensor, size: int, generator: torch.Generator | None = None,
                width: int | None = None) -> torch.Tensor:
    """A ``size`` x ``width`` (default square) window of each image (B, C, H, W) at a uniform
    place -> (B, C, size, width), by one gather."""
    B, C, H, W = images.shape
    width = size if width is None else width
    if size > H or width > W:
        raise ValueError(f"a {size}x{width} crop does not fit {H}x{W} images")
    device = images.device
    top = torch.randint(0, H - size + 1, (B,), device=device, generator=generator)  # (B,)
    left = torch.randint(0, W - width + 1, (B,), device=device, generator=generator)  # (B,)
    rows = top[:, None] + torch.arange(size, device=device)  # (B, size)
    cols = left[:, None] + torch.arange(width, device=device)  # (B, width)
    batch = torch.arange(B, device=device)[:, None, None, None]
    channel = torch.arange(C, device=device)[None, :, None, None]
    return images[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]  # (B, C, s, w)


def center_crop(images: torch.Tensor, size: int) -> torch.Tensor:
    """The central ``size`` x ``size`` window of images (..., H, W) (a view)."""
    H, W = images.shape[-2:]
    if size > H or size > W:
        raise ValueError(f"a {size}x{size} crop does not fit {H}x{W} images")
    top, left = (H - size) // 2, (W - size) // 2
    return images[..., top:top + size, left:left + size]
