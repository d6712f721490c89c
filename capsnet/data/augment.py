"""Batch preparation on the training device: scaling and the paper's random shift."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from capsnet.data.image_dataset import PIXEL_MAX


def to_model_input(images: torch.Tensor) -> torch.Tensor:
    """uint8 images (B, H, W) or (B, C, H, W) -> float32 (B, C, H, W) in [0, 1]."""
    if images.dim() == 3:
        images = images.unsqueeze(1)
    return images.to(torch.float32) / PIXEL_MAX


def random_shift(images: torch.Tensor, max_shift: int,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Shift each image by up to ``max_shift`` pixels in x and y, filling with zeros.

    images: (B, C, H, W) -> (B, C, H, W). One gather for the whole batch, no Python loop.
    Offsets are drawn uniformly from [-max_shift, max_shift] independently per image and axis.
    """
    if max_shift <= 0:
        return images
    B, C, H, W = images.shape
    padded = F.pad(images, (max_shift,) * 4)  # (B, C, H + 2s, W + 2s)
    offsets = torch.randint(0, 2 * max_shift + 1, (2, B), device=images.device,
                            generator=generator)  # (2, B): top-left corner of each crop
    rows = offsets[0, :, None] + torch.arange(H, device=images.device)  # (B, H)
    cols = offsets[1, :, None] + torch.arange(W, device=images.device)  # (B, W)
    batch = torch.arange(B, device=images.device)[:, None, None, None]
    channel = torch.arange(C, device=images.device)[None, :, None, None]
    return padded[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]  # (B, C, H, W)
