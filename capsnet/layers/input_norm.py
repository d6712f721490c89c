"""How a CapsNet's input images are presented to Conv1.

The paper's MNIST model takes the pixels as they are, in [0, 1]: its images are dark with
a few bright strokes, so most of Conv1's inputs are zero. Images with a dense, coloured
ground (photos, own data) give every primary capsule the same large common part: in the
first training steps all primary capsules saturate to nearly the same vector in every
image, every class capsule gets the same length and the model sits at chance. Standardising
each image (``input_norm='image'``) removes that common part: each channel's mean is
subtracted and the image is divided by its standard deviation over all channels and pixels,
floored at 1/sqrt(C*H*W) as tf.image.per_image_standardization does, so that a flat image
stays finite. It has no parameters: checkpoints, exports and every command that runs the
model apply it the same way, inside ``forward``.
"""
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
    """``mode`` 'none' (the paper: the pixels as they are) or 'image'
    (:func:`standardise_images`). Input and output (B, C, H, W)."""

    def __init__(self, mode: str = "none"):
        super().__init__()
        if mode not in INPUT_NORMS:
            raise ValueError(f"unknown input_norm {mode!r}; choose from {', '.join(INPUT_NORMS)}")
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return standardise_images(x) if self.mode == "image" else x

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}"
