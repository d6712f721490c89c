"""Image datasets held as tensors: loading a split of MNIST or Fashion-MNIST."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union

import numpy as np
import torch

from capsnet.data.idx import IDXError, read_idx
from capsnet.data.sources import get_spec, locate_dataset, verify_file

SPLITS = ("train", "test")
IMAGE_NDIM = 3  # (N, H, W)


@dataclass
class ImageDataset:
    """Grayscale images with integer labels.

    images: (N, H, W) uint8, labels: (N,) int64 in range(len(classes)).
    ``name`` is the dataset's name, e.g. "mnist" (the same for both splits).
    """

    images: torch.Tensor
    labels: torch.Tensor
    classes: tuple[str, ...]
    name: str

    def __post_init__(self):
        if self.images.dim() != IMAGE_NDIM or self.labels.dim() != 1:
            raise ValueError(f"{self.name}: expected images (N, H, W) and labels (N,), got "
                             f"{tuple(self.images.shape)} and {tuple(self.labels.shape)}")
        if len(self.images) != len(self.labels):
            raise ValueError(f"{self.name}: {len(self.images)} images but {len(self.labels)} labels")

    def __repr__(self) -> str:
        return (f"ImageDataset(name={self.name!r}, images={tuple(self.images.shape)} {self.images.dtype}, "
                f"labels={tuple(self.labels.shape)}, classes={len(self.classes)}, "
                f"device={self.images.device})")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def to(self, device: Union[str, torch.device]) -> "ImageDataset":
        """A new ImageDataset with both tensors on ``device``."""
        return ImageDataset(self.images.to(device), self.labels.to(device), self.classes, self.name)

    def subset(self, indices: Union[torch.Tensor, Sequence[int]]) -> "ImageDataset":
        """A new ImageDataset of the examples at ``indices`` (K,) -> images (K, H, W)."""
        index = torch.as_tensor(indices, dtype=torch.long, device=self.labels.device)
        return ImageDataset(self.images[index], self.labels[index], self.classes, self.name)


def _check_arrays(images: np.ndarray, labels: np.ndarray, images_path: Path, labels_path: Path,
                  num_classes: int) -> None:
    """Raise IDXError, naming the file, unless images (N, H, W) uint8 match labels (N,)."""
    if images.ndim != IMAGE_NDIM or images.dtype != np.uint8:
        raise IDXError(images_path, f"expected 3-D uint8 images, got {images.ndim}-D {images.dtype}")
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise IDXError(labels_path, f"expected 1-D integer labels, got {labels.ndim}-D {labels.dtype}")
    if len(images) != len(labels):
        raise IDXError(labels_path, f"{len(labels)} labels but {len(images)} images in {images_path}")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise IDXError(labels_path, f"labels span {labels.min()}..{labels.max()}, "
                                    f"expected 0..{num_classes - 1}")


def load_split(name: str, split: str, data_dir: Union[str, os.PathLike, None] = None,
               download: bool = True, verify: bool = False) -> ImageDataset:
    """Load the 'train' or 'test' split of a known dataset as an ImageDataset.

    Files are found by ``locate_dataset``. With ``verify``, each file's decompressed
    MD5 is checked against the spec first (ChecksumError, a ValueError, on mismatch).
    Raises IDXError naming the file when the files are malformed or do not match.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    spec = get_spec(name)
    paths = locate_dataset(spec, data_dir=data_dir, download=download)
    images_key, labels_key = f"{split}_images", f"{split}_labels"
    if verify:
        for key in (images_key, labels_key):
            verify_file(paths[key], spec.files[key][1])
    images, labels = read_idx(paths[images_key]), read_idx(paths[labels_key])
    _check_arrays(images, labels, paths[images_key], paths[labels_key], len(spec.classes))
    return ImageDataset(images=torch.from_numpy(images),
                        labels=torch.from_numpy(labels.astype(np.int64)),
                        classes=spec.classes, name=spec.name)


def load_dataset(name: str, data_dir: Union[str, os.PathLike, None] = None,
                 download: bool = True) -> tuple[ImageDataset, ImageDataset]:
    """The (train, test) splits of a known dataset."""
    return (load_split(name, "train", data_dir=data_dir, download=download),
            load_split(name, "test", data_dir=data_dir, download=download))
