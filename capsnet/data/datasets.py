"""Loading datasets by name: MNIST and Fashion-MNIST (IDX files), CIFAR-10, SVHN, and
folders of image files ("folder", whose root is the data_dir)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from capsnet.data.cifar import load_cifar10
from capsnet.data.folder import load_folder_dataset
from capsnet.data.idx import IDXError, read_idx
from capsnet.data.image_dataset import ImageDataset
from capsnet.data.sources import DATASETS, get_spec, locate_dataset, verify_file
from capsnet.data.svhn import load_svhn

SPLITS = ("train", "test")
IMAGE_NDIM = 3  # (N, H, W): IDX images are grey
FOLDER = "folder"


def _load_cifar10(split: str, data_dir, download: bool, verify: bool) -> ImageDataset:
    return load_cifar10(split, data_dir, download)  # no per-file checksums to verify


# name -> load(split, data_dir, download, verify), for the datasets that are not IDX files.
READERS: dict[str, Callable[..., ImageDataset]] = {"cifar10": _load_cifar10, "svhn": load_svhn}
DATASET_NAMES = tuple(DATASETS) + tuple(READERS) + (FOLDER,)


def _check_arrays(images: np.ndarray, labels: np.ndarray, images_path: Path, labels_path: Path,
                  num_classes: int) -> None:
    """Raise IDXError, naming the file, unless images (N, H, W) uint8 match labels (N,)."""
    if images.ndim != IMAGE_NDIM or images.dtype != np.uint8:
        raise IDXError(images_path, f"expected 3-D uint8 images, got {images.ndim}-D "
                                    f"{images.dtype}")
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise IDXError(labels_path, f"expected 1-D integer labels, got {labels.ndim}-D "
                                    f"{labels.dtype}")
    if len(images) != len(labels):
        raise IDXError(labels_path, f"{len(labels)} labels but {len(images)} images in "
                                    f"{images_path}")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise IDXError(labels_path, f"labels span {labels.min()}..{labels.max()}, "
                                    f"expected 0..{num_classes - 1}")


def _load_folder(data_dir: str | os.PathLike | None,
                 options: dict[str, Any]) -> tuple[ImageDataset, ImageDataset]:
    if data_dir is None:
        raise ValueError(f"dataset {FOLDER!r} needs its root folder as data_dir (--data-dir ROOT, "
                         f"holding ROOT/train/<class>/<images> and optionally ROOT/test/...)")
    return load_folder_dataset(data_dir, **options)


def _no_folder_options(name: str, options: dict[str, Any]) -> None:
    if options:
        raise ValueError(f"options {', '.join(sorted(options))} apply only to the {FOLDER!r} "
                         f"dataset, not {name!r}")


def load_split(name: str, split: str, data_dir: str | os.PathLike | None = None,
               download: bool = True, verify: bool = False, **folder_options: Any) -> ImageDataset:
    """The 'train' or 'test' split of a known dataset (DATASET_NAMES). ``verify`` checks MD5s
    first; malformed IDX files raise IDXError. For "folder", ``data_dir`` is the root and
    ``folder_options`` go to ``load_folder_dataset``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    key = name.lower()
    if key == FOLDER:
        return _load_folder(data_dir, folder_options)[SPLITS.index(split)]
    _no_folder_options(name, folder_options)
    if key in READERS:
        return READERS[key](split, data_dir, download, verify)
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASET_NAMES)}")
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


def load_dataset(name: str, data_dir: str | os.PathLike | None = None,
                 download: bool = True, **folder_options: Any) -> tuple[ImageDataset, ImageDataset]:
    """The (train, test) splits of a known dataset; a folder is decoded once for both."""
    if name.lower() == FOLDER:
        return _load_folder(data_dir, folder_options)
    _no_folder_options(name, folder_options)
    return (load_split(name, "train", data_dir=data_dir, download=download),
            load_split(name, "test", data_dir=data_dir, download=download))
