"""ImageDataset: uint8 images with integer labels, held as tensors, a torch Dataset of
(image, label); :func:`as_image_dataset` makes one of your tensors or any Dataset."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from capsnet.data.splits import held_out

PIXEL_MAX = 255  # uint8 images: 0 (black) .. PIXEL_MAX (white); model inputs are pixel / PIXEL_MAX
GREY_NDIM = 3  # (N, H, W)
CHANNELS_NDIM = 4  # (N, C, H, W)
CHANNEL_COUNTS = (1, 3)  # grey, RGB
LUMA_WEIGHTS = (0.299, 0.587, 0.114)  # RGB -> grey, ITU-R 601 (Pillow's "L" conversion)


def to_model_input(images: torch.Tensor) -> torch.Tensor:
    """uint8 images (B, H, W) or (B, C, H, W) -> float32 (B, C, H, W) in [0, 1]."""
    if images.dim() == 3:
        images = images.unsqueeze(1)
    return images.to(torch.float32) / PIXEL_MAX


@dataclass
class ImageDataset(Dataset):
    """Images (N, H, W) or (N, C, H, W) uint8, C = 1 or 3, with labels (N,) int64; ``name``
    the dataset's name, ``info`` its provenance. Item i is (image (C, H, W) float32 in
    [0, 1], label); training reads the uint8 tensors whole instead."""

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

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        """(image (C, H, W) float32 in [0, 1], label) of example ``index``."""

        return to_model_input(self.images[index][None])[0], int(self.labels[index])

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
        """Grey as RGB (the level in every channel) or RGB as grey (ITU-R 601 luma)."""
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
    """uint8 images (N, [C,] H, W) -> numpy (N, H, W) grey or (N, H, W, 3) RGB."""
    array = images.cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    if array.ndim == GREY_NDIM:
        return array
    if array.ndim != CHANNELS_NDIM or array.shape[1] not in CHANNEL_COUNTS:
        raise ValueError(f"expected images (N, H, W) or (N, C, H, W) with C in "
                         f"{CHANNEL_COUNTS}, got {tuple(array.shape)}")
    if array.shape[1] == 1:
        return array[:, 0]  # (N, H, W)
    return np.ascontiguousarray(np.moveaxis(array, 1, -1))  # (N, H, W, 3)


OWN_DATA = "own"  # the name of a dataset made of your own tensors (not a digit dataset)
UINT8_LEVELS = 256


def as_image_dataset(data: Any, name: str = OWN_DATA,
                     classes: Sequence[str] | None = None) -> ImageDataset:
    """Your data as an ImageDataset: (images, labels) or a map-style Dataset of (image, label).

    images: (N, [C,] H, W) uint8 or float in [0, 1] (rounded to 8 bits); Dataset items:
    tensors (C, H, W) or (H, W), or PIL images / arrays (H, W[, C]). ``classes`` names the
    classes (default: the Dataset's ``classes``, else "0", "1", ...)."""
    if isinstance(data, ImageDataset):
        return data
    if isinstance(data, tuple) and len(data) == 2:
        images, labels = (torch.as_tensor(np.asarray(x)) if not isinstance(x, torch.Tensor)
                          else x for x in data)
    elif isinstance(data, Dataset):
        pairs = [data[i] for i in range(len(data))]
        images = torch.stack([_channels_first(image) for image, _ in pairs])
        labels = torch.as_tensor([int(label) for _, label in pairs])
        classes = classes or getattr(data, "classes", None)
    else:
        raise ValueError(f"expected a pair (images, labels) or a torch Dataset of (image, label) "
                         f"items, got {type(data).__name__}")
    labels = labels.long()
    if labels.dim() != 1 or len(labels) != len(images) or not len(labels):
        raise ValueError(f"expected labels (N,) for images (N, ...), got {tuple(labels.shape)} "
                         f"for {tuple(images.shape)}")
    if labels.min() < 0:
        raise ValueError(f"labels must be class indices 0..K-1, got {int(labels.min())}")
    count = int(labels.max()) + 1
    names = tuple(str(c) for c in classes) if classes else tuple(map(str, range(count)))
    if len(names) < count:
        raise ValueError(f"labels go up to {count - 1} but {len(names)} classes are named")
    return ImageDataset(uint8_images(images.cpu()), labels.cpu(), names, name)


def uint8_images(images: torch.Tensor) -> torch.Tensor:
    """Images as uint8 levels: uint8 kept, float in [0, 1] scaled by PIXEL_MAX and rounded."""
    if images.dtype == torch.uint8:
        return images
    if not images.is_floating_point():
        if images.min() < 0 or images.max() >= UINT8_LEVELS:
            raise ValueError(f"integer images must be levels 0..{PIXEL_MAX}")
        return images.to(torch.uint8)
    low, high = float(images.min()), float(images.max())
    if low < 0 or high > 1:
        raise ValueError(f"float images must be in [0, 1], got values in [{low:.3g}, "
                         f"{high:.3g}]; pass uint8 levels 0..{PIXEL_MAX} instead")
    return (images * PIXEL_MAX).round().to(torch.uint8)


def _channels_first(image: Any) -> torch.Tensor:
    """One Dataset item's image as a tensor (C, H, W) (or (H, W) as it is)."""
    if isinstance(image, torch.Tensor):
        return image
    array = np.array(image.convert("RGB") if isinstance(image, Image.Image)
                       and image.mode not in ("L", "RGB") else image)
    tensor = torch.as_tensor(array)
    return tensor.movedim(-1, 0) if tensor.dim() == GREY_NDIM else tensor  # (C, H, W)


def held_out_split(dataset: ImageDataset, fraction: float, seed: int = 0
                   ) -> tuple[ImageDataset, ImageDataset]:
    """(the rest, a stratified ``fraction``), the same for every run with ``seed``."""
    kept, taken = held_out(dataset.labels, fraction, seed)
    split = dataclasses.replace(dataset, info={**dataset.info, "test_split": {
        "seed": seed, "fraction": fraction, "indices": taken.tolist()}})
    return split.subset(kept), split.subset(taken)
