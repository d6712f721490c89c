"""CIFAR-10, binary version: six batch files of records (1 label byte, 3072 pixel bytes,
channel-major 32x32), never unpickled. Looked for in a directory or its
``cifar-10-batches-bin/``; else the official archive is downloaded, verified and its
batch files extracted into the cache."""

from __future__ import annotations

import os
import shutil
import tarfile
import zlib
from pathlib import Path, PurePosixPath

import numpy as np
import torch

from capsnet.atomic import atomic_write
from capsnet.data.idx import DatasetFileError
from capsnet.data.image_dataset import ImageDataset
from capsnet.data.sources import (
    DOWNLOAD_TIMEOUT_S,
    ProgressFn,
    RemoteFile,
    download_file,
    locate_files,
)

NAME = "cifar10"
CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
           "dog", "frog", "horse", "ship", "truck")
CHANNELS, HEIGHT, WIDTH = 3, 32, 32
LABEL_BYTES = 1
RECORD_BYTES = LABEL_BYTES + CHANNELS * HEIGHT * WIDTH  # 3073
BATCH_DIR = "cifar-10-batches-bin"  # the folder inside the official archive
SPLIT_FILES = {
    "train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
    "test": ("test_batch.bin",),
}
ALL_FILES = SPLIT_FILES["train"] + SPLIT_FILES["test"]
ARCHIVE = RemoteFile(
    name="cifar-10-binary.tar.gz",
    urls=("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",),
    md5="c32a1d4ab5d03f1284b67883e8d87530",
)
# What a damaged tar.gz raises while being read.
ARCHIVE_ERRORS = (tarfile.TarError, EOFError, zlib.error, OSError)


def read_cifar_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """One batch file -> images (N, 3, 32, 32) uint8 and labels (N,) uint8; DatasetFileError
    naming the file when it is missing, not whole records, or has a label outside 0..9."""
    try:
        raw = np.fromfile(path, dtype=np.uint8)  # (N * 3073,)
    except OSError as err:
        raise DatasetFileError(path, f"cannot read file: {err.strerror or err}") from err
    if raw.size == 0 or raw.size % RECORD_BYTES:
        raise DatasetFileError(path, f"size {raw.size} bytes is not a positive multiple of the "
                                     f"{RECORD_BYTES}-byte CIFAR-10 record (truncated or not a "
                                     f"CIFAR-10 binary batch)")
    records = raw.reshape(-1, RECORD_BYTES)  # (N, 3073)
    labels = records[:, 0].copy()  # (N,)
    if labels.max() >= len(CLASSES):
        first = int(np.argmax(labels >= len(CLASSES)))
        raise DatasetFileError(path, f"record {first} has label {labels[first]}, expected "
                                     f"0..{len(CLASSES) - 1}")
    images = records[:, LABEL_BYTES:].reshape(-1, CHANNELS, HEIGHT, WIDTH)  # (N, 3, 32, 32)
    return images, labels


def find_batches(directory: Path) -> Path | None:
    """``directory`` or its ``cifar-10-batches-bin/`` when it holds all six batch files."""
    for candidate in (directory, directory / BATCH_DIR):
        if all((candidate / name).is_file() for name in ALL_FILES):
            return candidate
    return None


def locate_cifar10(data_dir: str | os.PathLike | None = None, download: bool = True) -> Path:
    """The directory holding the six batch files (see :func:`locate_files`); downloads them."""
    return locate_files(NAME, find_batches, download_cifar10,
                        needed=f"the six files {', '.join(ALL_FILES)} (or a {BATCH_DIR} folder)",
                        data_dir=data_dir, download=download)


def load_cifar10(split: str, data_dir: str | os.PathLike | None = None,
                 download: bool = True) -> ImageDataset:
    """The 'train' (five batches) or 'test' split: images (N, 3, 32, 32) uint8."""
    if split not in SPLIT_FILES:
        raise ValueError(f"unknown split {split!r}; expected one of {tuple(SPLIT_FILES)}")
    directory = locate_cifar10(data_dir, download)
    parts = [read_cifar_batch(directory / name) for name in SPLIT_FILES[split]]
    images = np.concatenate([part[0] for part in parts])  # (N, 3, 32, 32)
    labels = np.concatenate([part[1] for part in parts])  # (N,)
    return ImageDataset(images=torch.from_numpy(images),
                        labels=torch.from_numpy(labels.astype(np.int64)),
                        classes=CLASSES, name=NAME)


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
    for name in ALL_FILES:
        member = members.get(f"{BATCH_DIR}/{name}")
        if member is None or not member.isfile():
            problem = "missing" if member is None else "not a regular file"
            raise ValueError(f"archive member {BATCH_DIR}/{name} is {problem}")


def extract_batches(archive: Path, dest_dir: Path) -> Path:
    """Copy the six batch files, by name, out of a checked archive into
    ``dest_dir/cifar-10-batches-bin``, each atomically (never ``tar.extract``)."""
    out_dir = dest_dir / BATCH_DIR
    with tarfile.open(archive, "r:gz") as tar:
        for name in ALL_FILES:
            with tar.extractfile(f"{BATCH_DIR}/{name}") as source:
                atomic_write(out_dir / name, lambda out, source=source:
                             shutil.copyfileobj(source, out))
    return out_dir


def download_cifar10(dest_dir: str | os.PathLike, archive: RemoteFile | None = None,
                     timeout: float = DOWNLOAD_TIMEOUT_S,
                     progress: ProgressFn | None = None) -> Path:
    """Download and verify the archive, extract the batch files, delete the archive; returns
    the batch directory."""
    dest_dir = Path(dest_dir)
    path = download_file(archive or ARCHIVE, dest_dir, check=check_archive, timeout=timeout,
                         progress=progress)
    try:
        return extract_batches(path, dest_dir)
    finally:
        path.unlink(missing_ok=True)
