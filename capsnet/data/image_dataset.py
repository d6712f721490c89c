"""ImageDataset: uint8 images, grey or colour, with integer labels, held as tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

PIXEL_MAX = 255  # uint8 images: 0 (black) .. PIXEL_MAX (white); model inputs are pixel / PIXEL_MAX
GREY_NDIM = 3  # (N, H, W)
CHANNELS_NDIM = 4  # (N, C, H, W)
CHANNEL_COUNTS = (1, 3)  # grey, RGB
LUMA_WEIGHTS = (0.299, 0.587, 0.114)  # RGB -> grey, ITU-R 601 (Pillow's "L" conversion)


@dataclass
class ImageDataset:
    """Images with integer labels.

    images: (N, H, W) uint8 grey, or (N, C, H, W) uint8 with C = 1 (grey) or 3 (RGB);
    labels: (N,) int64 in range(len(classes)). ``name`` is the dataset's name, e.g.
    "mnist" (the same for both splits). ``info`` holds provenance, e.g. a recorded
    train/test split or the files skipped as unreadable (see capsnet.data.folder).
    """

    images: torch.Tensor
    labels: torch.Tensor
    classes: tuple[str, ...]
    name: str
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        shape = tuple(self.images.shape)
        grey = self.images.dim() == GREY_NDIM
        colour = self.images.dim() == CHANNELS_NDIM and shape[1] in CHANNEL_COUNTS
        if not (grey or colour) or self.labels.dim() != 1:
            raise ValueError(f"{self.name}: expected images (N, H, W) or (N, C, H, W) with C in "
                             f"{CHANNEL_COUNTS} and labels (N,), got {shape} and "
                             f"{tuple(self.labels.shape)}")
        if len(self.images) != len(self.labels):
            raise ValueError(f"{self.name}: {len(self.images)} images but "
                             f"{len(self.labels)} labels")

    def __repr__(self) -> str:
        return (f"ImageDataset(name={self.name!r}, "
                f"images={tuple(self.images.shape)} {self.images.dtype}, "
                f"labels={tuple(self.labels.shape)}, classes={len(self.classes)}, "
                f"device={self.images.device})")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def channels(self) -> int:
        """1 for grey images (N, H, W) or (N, 1, H, W), 3 for RGB (N, 3, H, W)."""
        return 1 if self.images.dim() == GREY_NDIM else int(self.images.shape[1])

    @property
    def image_size(self) -> tuple[int, int]:
        """(H, W) of every image."""
        height, width = self.images.shape[-2:]
        return int(height), int(width)

    def to(self, device: str | torch.device) -> ImageDataset:
        """A new ImageDataset with both tensors on ``device``."""
        return ImageDataset(self.images.to(device), self.labels.to(device), self.classes, self.name,
                            dict(self.info))

    def subset(self, indices: torch.Tensor | Sequence[int]) -> ImageDataset:
        """A new ImageDataset of the examples at ``indices`` (K,) -> images (K, ...)."""
        index = torch.as_tensor(indices, dtype=torch.long, device=self.labels.device)
        return ImageDataset(self.images[index], self.labels[index], self.classes, self.name,
                            dict(self.info))

    def resized(self, size: int) -> ImageDataset:
        """Every image resized to ``size`` x ``size`` (antialiased bilinear, uint8 again)."""
        if self.image_size == (size, size):
            return self
        x = self.images.unsqueeze(1) if self.images.dim() == GREY_NDIM else self.images
        x = torch.nn.functional.interpolate(x.float(), size=(size, size), mode="bilinear",
                                            antialias=True, align_corners=False)
        x = x.round().clamp(0, PIXEL_MAX).to(torch.uint8)  # (N, C, size, size)
        images = x.squeeze(1) if self.images.dim() == GREY_NDIM else x
        return ImageDataset(images, self.labels, self.classes, self.name, dict(self.info))

    def with_channels(self, channels: int) -> ImageDataset:
        """Grey images (N, H, W) as (N, 3, H, W) RGB (the grey level in every channel), or
        RGB images as grey (ITU-R 601 luma, as Pillow converts); the same data otherwise."""
        if channels not in CHANNEL_COUNTS:
            raise ValueError(f"channels must be one of {CHANNEL_COUNTS}, got {channels}")
        if channels == self.channels:
            return self
        if channels == 3:
            grey = self.images if self.images.dim() == GREY_NDIM else self.images[:, 0]
            images = grey.unsqueeze(1).expand(-1, 3, -1, -1).contiguous()  # (N, 3, H, W)
        else:
            weights = torch.tensor(LUMA_WEIGHTS, device=self.images.device).view(1, 3, 1, 1)
            images = (self.images.float() * weights).sum(1).round().to(torch.uint8)  # (N, H, W)
        return ImageDataset(images, self.labels, self.classes, self.name, dict(self.info))


def display_images(images: torch.Tensor | np.ndarray) -> np.ndarray:
    """uint8 images (N, H, W) or (N, C, H, W), C = 1 or 3 -> a numpy array in the display
    layout that PIL, matplotlib and PNG files take: (N, H, W) grey or (N, H, W, 3) RGB."""
    array = images.cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    if array.ndim == GREY_NDIM:
        return array
    if array.ndim != CHANNELS_NDIM or array.shape[1] not in CHANNEL_COUNTS:
        raise ValueError(f"expected images (N, H, W) or (N, C, H, W) with C in "
                         f"{CHANNEL_COUNTS}, got {tuple(array.shape)}")
    if array.shape[1] == 1:
        return array[:, 0]  # (N, H, W)
    return np.ascontiguousarray(np.moveaxis(array, 1, -1))  # (N, H, W, 3)
