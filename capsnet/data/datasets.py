"""Loading datasets by name: MNIST and Fashion-MNIST (IDX files), CIFAR-10 (binary batches),
SVHN (MATLAB files) and folders of image files ("folder", whose root is the data_dir).
Malformed files raise DatasetFileError (IDXError for IDX files) naming the file."""

from __future__ import annotations

import math
import os
import shutil
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import torch

from capsnet.atomic import atomic_write
from capsnet.data.folder import load_folder_dataset
from capsnet.data.idx import DatasetFileError, IDXError, first_line, read_idx
from capsnet.data.image_dataset import ImageDataset
from capsnet.data.sources import (
    DATASETS,
    DIGITS,
    RemoteFile,
    download_file,
    locate_dataset,
    locate_files,
    verify_file,
)

SPLITS = ("train", "test")
FOLDER = "folder"
CIFAR10, SVHN = "cifar10", "svhn"
DATASET_NAMES = (*DATASETS, CIFAR10, SVHN, FOLDER)

# CIFAR-10, binary version: six batch files of records (1 label byte, 3072 pixel bytes,
# channel-major 32x32), never unpickled.
CIFAR_CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
                 "dog", "frog", "horse", "ship", "truck")
CIFAR_SHAPE = (3, 32, 32)  # (C, H, W)
CIFAR_RECORD_BYTES = 1 + math.prod(CIFAR_SHAPE)  # a label byte, then the pixels: 3073
CIFAR_BATCH_DIR = "cifar-10-batches-bin"  # the folder inside the official archive
CIFAR_SPLIT_FILES = {
    "train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
    "test": ("test_batch.bin",),
}
CIFAR_FILES = CIFAR_SPLIT_FILES["train"] + CIFAR_SPLIT_FILES["test"]
CIFAR_ARCHIVE = RemoteFile(
    name="cifar-10-binary.tar.gz",
    urls=("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",),
    md5="c32a1d4ab5d03f1284b67883e8d87530",
)
ARCHIVE_ERRORS = (tarfile.TarError, EOFError, zlib.error, OSError)  # from a damaged tar.gz

# SVHN, cropped digits: X (32, 32, 3, N) uint8 and y (N, 1) labels 1..10 (10 is the digit 0).
SVHN_IMAGE_SHAPE = (32, 32, 3)  # (H, W, C) of X's first three axes
SVHN_FIRST_LABEL, SVHN_ZERO_LABEL = 1, 10
SVHN_URL = "http://ufldl.stanford.edu/housenumbers"
SVHN_FILES = {
    "train": RemoteFile("train_32x32.mat", (f"{SVHN_URL}/train_32x32.mat",),
                        "e26dedcc434d2e4c54c9b2d4a06d8373"),
    "test": RemoteFile("test_32x32.mat", (f"{SVHN_URL}/test_32x32.mat",),
                       "eb5a983be6a315427106f1b164d9cef3"),
}


def _tensors(images: np.ndarray, labels: np.ndarray, classes: tuple[str, ...],
             name: str) -> ImageDataset:
    return ImageDataset(torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64)),
                        classes, name)


def load_split(name: str, split: str, data_dir: str | os.PathLike | None = None,
               download: bool = True, verify: bool = False, **folder_options: Any) -> ImageDataset:
    """The 'train' or 'test' split of a known dataset (DATASET_NAMES). ``verify`` checks MD5s
    first (IDX and SVHN files). For "folder", ``data_dir`` is the root and ``folder_options``
    go to ``load_folder_dataset``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    key = name.lower()
    if key == FOLDER:
        return load_dataset(FOLDER, data_dir, **folder_options)[SPLITS.index(split)]
    if folder_options:
        raise ValueError(f"options {', '.join(sorted(folder_options))} apply only to the "
                         f"{FOLDER!r} dataset, not {name!r}")
    if key == CIFAR10:
        return load_cifar10(split, data_dir, download)  # no per-file checksums to verify
    if key == SVHN:
        return load_svhn(split, data_dir, download, verify)
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASET_NAMES)}")
    spec = DATASETS[key]
    paths = locate_dataset(spec, data_dir=data_dir, download=download)
    images_path, labels_path = paths[f"{split}_images"], paths[f"{split}_labels"]
    if verify:
        verify_file(images_path, spec.files[f"{split}_images"][1])
        verify_file(labels_path, spec.files[f"{split}_labels"][1])
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise IDXError(images_path, f"expected 3-D uint8 images, got {images.ndim}-D "
                                    f"{images.dtype}")
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise IDXError(labels_path, f"expected 1-D integer labels, got {labels.ndim}-D "
                                    f"{labels.dtype}")
    if len(images) != len(labels):
        raise IDXError(labels_path, f"{len(labels)} labels but {len(images)} images in "
                                    f"{images_path}")
    if len(labels) and (labels.min() < 0 or labels.max() >= len(spec.classes)):
        raise IDXError(labels_path, f"labels span {labels.min()}..{labels.max()}, "
                                    f"expected 0..{len(spec.classes) - 1}")
    return _tensors(images, labels, spec.classes, spec.name)  # images (N, 28, 28)


def load_dataset(name: str, data_dir: str | os.PathLike | None = None,
                 download: bool = True, **folder_options: Any) -> tuple[ImageDataset, ImageDataset]:
    """The (train, test) splits of a known dataset; a folder is decoded once for both."""
    if name.lower() != FOLDER:
        return (load_split(name, "train", data_dir, download, **folder_options),
                load_split(name, "test", data_dir, download))
    if data_dir is None:
        raise ValueError(f"dataset {FOLDER!r} needs its root folder as data_dir (--data-dir ROOT, "
                         f"holding ROOT/train/<class>/<images> and optionally ROOT/test/...)")
    return load_folder_dataset(data_dir, **folder_options)


# --- CIFAR-10 ------------------------------------------------------------------------------

def read_cifar_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """One batch file -> images (N, 3, 32, 32) uint8 and labels (N,) uint8; DatasetFileError
    naming the file when it is missing, not whole records, or has a label outside 0..9."""
    try:
        raw = np.fromfile(path, dtype=np.uint8)  # (N * 3073,)
    except OSError as err:
        raise DatasetFileError(path, f"cannot read file: {err.strerror or err}") from err
    if raw.size == 0 or raw.size % CIFAR_RECORD_BYTES:
        raise DatasetFileError(path, f"size {raw.size} bytes is not a positive multiple of the "
                                     f"{CIFAR_RECORD_BYTES}-byte CIFAR-10 record (truncated or "
                                     f"not a CIFAR-10 binary batch)")
    records = raw.reshape(-1, CIFAR_RECORD_BYTES)  # (N, 3073)
    labels = records[:, 0].copy()  # (N,)
    if labels.max() >= len(CIFAR_CLASSES):
        first = int(np.argmax(labels >= len(CIFAR_CLASSES)))
        raise DatasetFileError(path, f"record {first} has label {labels[first]}, expected "
                                     f"0..{len(CIFAR_CLASSES) - 1}")
    return records[:, 1:].reshape(-1, *CIFAR_SHAPE), labels  # (N, 3, 32, 32), (N,)


def locate_cifar10(data_dir: str | os.PathLike | None = None, download: bool = True) -> Path:
    """The directory holding the six batch files, itself or its ``cifar-10-batches-bin/``
    (see :func:`locate_files`); downloads them."""
    def find_batches(directory: Path) -> Path | None:
        for candidate in (directory, directory / CIFAR_BATCH_DIR):
            if all((candidate / name).is_file() for name in CIFAR_FILES):
                return candidate
        return None

    return locate_files(CIFAR10, find_batches, download_cifar10,
                        needed=f"the six files {', '.join(CIFAR_FILES)} (or a {CIFAR_BATCH_DIR} "
                               f"folder)", data_dir=data_dir, download=download)


def load_cifar10(split: str, data_dir: str | os.PathLike | None = None,
                 download: bool = True) -> ImageDataset:
    """The 'train' (five batches) or 'test' split: images (N, 3, 32, 32) uint8."""
    if split not in CIFAR_SPLIT_FILES:
        raise ValueError(f"unknown split {split!r}; expected one of {tuple(CIFAR_SPLIT_FILES)}")
    directory = locate_cifar10(data_dir, download)
    parts = [read_cifar_batch(directory / name) for name in CIFAR_SPLIT_FILES[split]]
    images = np.concatenate([part[0] for part in parts])  # (N, 3, 32, 32)
    labels = np.concatenate([part[1] for part in parts])  # (N,)
    return _tensors(images, labels, CIFAR_CLASSES, CIFAR10)


def check_archive(path: Path) -> None:
    """Raise ValueError unless the tar.gz is readable, has no absolute or '..' member, and
    holds every batch file as a regular file."""
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = {member.name: member for member in tar.getmembers()}
    except ARCHIVE_ERRORS as err:
        raise ValueError(f"not a readable tar.gz archive: {err}") from err
    for name in members:
        parts = PurePosixPath(name).parts
        if name.startswith(("/", "\\")) or ".." in parts or (parts and ":" in parts[0]):
            raise ValueError(f"unsafe archive member {name!r} (absolute path or '..')")
    for name in CIFAR_FILES:
        member = members.get(f"{CIFAR_BATCH_DIR}/{name}")
        if member is None or not member.isfile():
            problem = "missing" if member is None else "not a regular file"
            raise ValueError(f"archive member {CIFAR_BATCH_DIR}/{name} is {problem}")


def download_cifar10(dest_dir: str | os.PathLike, archive: RemoteFile | None = None) -> Path:
    """Download and verify the archive, copy the six batch files by name (never
    ``tar.extract``), each atomically, into ``dest_dir/cifar-10-batches-bin``, delete the
    archive; returns the batch directory."""
    dest_dir = Path(dest_dir)
    path = download_file(archive or CIFAR_ARCHIVE, dest_dir, check=check_archive)
    out_dir = dest_dir / CIFAR_BATCH_DIR
    try:
        with tarfile.open(path, "r:gz") as tar:
            for name in CIFAR_FILES:
                with tar.extractfile(f"{CIFAR_BATCH_DIR}/{name}") as source:
                    atomic_write(out_dir / name, lambda out, source=source:
                                 shutil.copyfileobj(source, out))
    finally:
        path.unlink(missing_ok=True)
    return out_dir


# --- SVHN ----------------------------------------------------------------------------------

def read_svhn_mat(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """One .mat file -> images (N, 3, 32, 32) uint8 and labels (N,) uint8 in 0..9;
    DatasetFileError naming the file when it is not SVHN's. Needs scipy."""
    try:
        from scipy.io import loadmat
    except ImportError as err:
        raise ImportError("reading SVHN's .mat files needs scipy: pip install scipy "
                          "(or pip install 'capsnet[datasets]')") from err
    try:
        contents = loadmat(os.fspath(path), variable_names=("X", "y"))
    except Exception as err:  # scipy raises ValueError, TypeError, OSError... on bad files
        raise DatasetFileError(path, f"cannot read MATLAB file: {first_line(err)}") from err
    if "X" not in contents or "y" not in contents:
        raise DatasetFileError(path, "expected variables X and y")
    x, y = contents["X"], contents["y"]
    if x.shape[:-1] != SVHN_IMAGE_SHAPE or x.dtype != np.uint8:
        raise DatasetFileError(path, f"expected X of shape (32, 32, 3, N) uint8, got {x.shape} "
                                     f"{x.dtype}")
    n = x.shape[-1]
    if y.size != n or y.ndim > 2 or y.dtype.kind not in "iuf":
        raise DatasetFileError(path, f"expected y of shape ({n}, 1) with integer labels, got "
                                     f"{y.shape} {y.dtype}")
    labels = y.reshape(n)  # (N,)
    out_of_range = n and (labels.min() < SVHN_FIRST_LABEL or labels.max() > SVHN_ZERO_LABEL)
    if out_of_range or (labels != labels.round()).any():
        raise DatasetFileError(path, f"labels span {labels.min()}..{labels.max()}, expected "
                                     f"integers {SVHN_FIRST_LABEL}..{SVHN_ZERO_LABEL}")
    labels = np.where(labels == SVHN_ZERO_LABEL, 0, labels).astype(np.uint8)  # (N,)
    return np.ascontiguousarray(x.transpose(3, 2, 0, 1)), labels  # (N, C, H, W), (N,)


def download_svhn(dest_dir: str | os.PathLike,
                  files: dict[str, RemoteFile] | None = None) -> dict[str, Path]:
    """Both .mat files (default SVHN_FILES) in ``dest_dir``, MD5-verified, kept when right."""
    return {split: download_file(remote, dest_dir)
            for split, remote in (files or SVHN_FILES).items()}


def load_svhn(split: str, data_dir: str | os.PathLike | None = None, download: bool = True,
              verify: bool = False) -> ImageDataset:
    """The 'train' or 'test' split, classes "0".."9"; ``verify`` checks the file's MD5 first."""
    if split not in SVHN_FILES:
        raise ValueError(f"unknown split {split!r}; expected one of {tuple(SVHN_FILES)}")

    def find_mat_files(directory: Path) -> dict[str, Path] | None:
        paths = {split: directory / remote.name for split, remote in SVHN_FILES.items()}
        return paths if all(path.is_file() for path in paths.values()) else None

    names = ", ".join(remote.name for remote in SVHN_FILES.values())
    path = locate_files(SVHN, find_mat_files, download_svhn, needed=f"the two files {names}",
                        data_dir=data_dir, download=download)[split]
    if verify:
        verify_file(path, SVHN_FILES[split].md5, decompress=False)
    return _tensors(*read_svhn_mat(path), DIGITS, SVHN)
