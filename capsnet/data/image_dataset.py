"""ImageDataset: uint8 images with integer labels, held as tensors, a torch Dataset of
(image, label); :func:`as_image_dataset` makes one of your tensors or any Dataset. Seeded,
class-stratified splits and per-epoch orderings."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

PIXEL_MAX = 255  # uint8 images: 0 (black) .. PIXEL_MAX (white); model inputs are pixel / PIXEL_MAX
GREY_NDIM = 3  # (N, H, W)
CHANNELS_NDIM = 4  # (N, C, H, W)
CHANNEL_COUNTS = (1, 3)  # grey, RGB
LUMA_WEIGHTS = (0.299, 0.587, 0.114)  # RGB -> grey, ITU-R 601 (Pillow's "L" conversion)
OWN_DATA = "own"  # the name of a dataset made of your own tensors (not a digit dataset)


def to_model_input(images: torch.Tensor) -> torch.Tensor:
    """uint8 images (B, H, W) or (B, C, H, W) -> float32 (B, C, H, W) in [0, 1]."""
    if images.dim() == GREY_NDIM:
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

    def replaced(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> ImageDataset:
        """A new ImageDataset of ``images`` (and ``labels``) with this one's classes and info."""
        return dataclasses.replace(self, images=images.contiguous(),
                                   labels=self.labels if labels is None else labels,
                                   info=dict(self.info))

    def to(self, device: str | torch.device) -> ImageDataset:
        """A new ImageDataset with both tensors on ``device``."""
        return self.replaced(self.images.to(device), self.labels.to(device))

    def subset(self, indices: torch.Tensor | Sequence[int]) -> ImageDataset:
        """A new ImageDataset of the examples at ``indices`` (K,) -> images (K, ...)."""
        index = torch.as_tensor(indices, dtype=torch.long, device=self.labels.device)
        return self.replaced(self.images[index], self.labels[index])

    def resized(self, size: int) -> ImageDataset:
        """Every image resized to ``size`` x ``size`` (antialiased bilinear, uint8 again)."""
        if self.image_size == (size, size):
            return self
        grey = self.images.dim() == GREY_NDIM
        x = (self.images.unsqueeze(1) if grey else self.images).float()  # (N, C, H, W)
        x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear",
                                            antialias=True, align_corners=False)
        x = x.round().clamp(0, PIXEL_MAX).to(torch.uint8)  # (N, C, size, size)
        return self.replaced(x.squeeze(1) if grey else x)

    def with_channels(self, channels: int) -> ImageDataset:
        """Grey as RGB (the level in every channel) or RGB as grey (ITU-R 601 luma)."""
        if channels not in CHANNEL_COUNTS:
            raise ValueError(f"channels must be one of {CHANNEL_COUNTS}, got {channels}")
        if channels == self.channels:
            return self
        if channels == 3:
            grey = self.images if self.images.dim() == GREY_NDIM else self.images[:, 0]
            return self.replaced(grey.unsqueeze(1).expand(-1, 3, -1, -1))  # (N, 3, H, W)
        weights = torch.tensor(LUMA_WEIGHTS, device=self.images.device).view(1, 3, 1, 1)
        return self.replaced((self.images.float() * weights).sum(1).round().to(torch.uint8))


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
        if images.min() < 0 or images.max() > PIXEL_MAX:
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


def stratified_split(labels: torch.Tensor, val_size: int,
                     seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted, disjoint indices (train, val) covering (N,) labels, ``val_size`` of them
    spread over the classes by frequency; deterministic for a seed."""
    labels = labels.cpu()
    n = labels.numel()
    if not 0 <= val_size < n:
        raise ValueError(f"validation size {val_size} must be in [0, {n})")
    g = torch.Generator().manual_seed(seed)
    classes, counts = labels.unique(return_counts=True)
    # Largest-remainder apportionment of val_size over the classes.
    quotas = counts.double() * val_size / n
    take = quotas.floor().long()
    remainder = val_size - int(take.sum())
    take[torch.argsort(quotas - take, descending=True)[:remainder]] += 1
    val_parts = []
    for cls, k in zip(classes.tolist(), take.tolist(), strict=True):
        members = (labels == cls).nonzero().squeeze(1)
        val_parts.append(members[torch.randperm(members.numel(), generator=g)[:k]])
    val = torch.cat(val_parts).sort().values
    is_val = torch.zeros(n, dtype=torch.bool)
    is_val[val] = True
    return (~is_val).nonzero().squeeze(1), val


def held_out(labels: torch.Tensor, fraction: float,
             seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept, held out) indices: a stratified ``fraction`` of labels (N,), at least one of
    each side."""
    n = labels.numel()
    return stratified_split(labels, min(max(1, round(fraction * n)), n - 1), seed)


def held_out_split(dataset: ImageDataset, fraction: float, seed: int = 0
                   ) -> tuple[ImageDataset, ImageDataset]:
    """(the rest, a stratified ``fraction``), the same for every run with ``seed``."""
    kept, taken = held_out(dataset.labels, fraction, seed)
    split = dataclasses.replace(dataset, info={**dataset.info, "test_split": {
        "seed": seed, "fraction": fraction, "indices": taken.tolist()}})
    return split.subset(kept), split.subset(taken)


def epoch_order(n: int, seed: int, epoch: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The shuffled order of ``n`` examples for one epoch, a function of (seed, epoch) only,
    so that a resumed run sees exactly the batches it would have seen."""
    g = torch.Generator().manual_seed(epoch_seed(seed, epoch))
    return torch.randperm(n, generator=g).to(device)


def epoch_seed(seed: int, epoch: int) -> int:
    """One 63-bit seed from a run seed and an epoch number."""
    return (seed * 1_000_003 + epoch * 7_919 + 12_345) % (2**63 - 1)
