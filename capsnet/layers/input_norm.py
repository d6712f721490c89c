"""How a CapsNet's input images meet Conv1: as they are (the paper), or each image standardised
(``input_norm='image'``: channel means removed, divided by the standard deviation floored at
1/sqrt(C*H*W), as tf.image.per_image_standardization), so that a dense coloured ground does
not saturate every primary capsule alike. No parameters; applied inside ``forward``."""
from __future__ import annotations

import math

import torch
from torch import nn

from capsnet.config import INPUT_NORMS


def standardise_images(x: torch.Tensor) -> torch.Tensor:
    """x (B, C, H, W) -> (B, C, H, W): per-channel mean zero, overall unit variance per image."""
    B, C, H, W = x.shape
    centred = x - x.mean(dim=(2, 3), keepdim=True)  # (B, C, H, W)
    spread = centred.flatten(1).std(dim=1, unbiased=False)  # (B,)
    floor = 1.0 / math.sqrt(C * H * W)
    return centred / spread.clamp_min(floor).view(B, 1, 1, 1)


class InputNorm(nn.Module):
    """``mode`` 'none' or 'image' (:func:`standardise_images`). (B, C, H, W) -> (B, C, H, W)."""

    def __init__(self, mode: str = "none"):
        super().__init__()
        if mode not in INPUT_NORMS:
            raise ValueError(f"unknown input_norm {mode!r}; choose from {', '.join(INPUT_NORMS)}")
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return standardise_images(x) if self.mode == "image" else x

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}"
