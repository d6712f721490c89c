"""The paper's augmentation, shifts of up to ``max_shift`` pixels in x and y (zero fill),
drawn for a whole epoch at its start: one draw for every image of the training set, so that
an epoch's batches only gather (nothing drawn between steps, nothing for the host to do),
and a generator seeded by (seed, epoch) draws the same shifts again in a resumed epoch."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from capsnet.data.transforms import crop_at


def epoch_shifts(count: int, max_shift: int, generator: torch.Generator | None = None,
                 device: torch.device | str | None = None) -> torch.Tensor:
    """(count, 2) int64: for each image its (top, left) corner in the image padded by
    ``max_shift`` on every side, uniform in [0, 2 max_shift] and independent (a shift of
    corner - max_shift pixels), drawn by one randint."""
    return torch.randint(0, 2 * max_shift + 1, (count, 2), generator=generator, device=device)


def shift_by(images: torch.Tensor, corners: torch.Tensor, max_shift: int) -> torch.Tensor:
    """Images (B, C, H, W) shifted as ``corners`` (B, 2) from :func:`epoch_shifts` say:
    zero padded by ``max_shift`` and cut back to H x W at each corner (one gather)."""
    if max_shift <= 0:
        return images
    H, W = images.shape[-2:]
    padded = F.pad(images, (max_shift,) * 4)  # (B, C, H + 2s, W + 2s)
    return crop_at(padded, corners[:, 0], corners[:, 1], H, W)  # (B, C, H, W)
