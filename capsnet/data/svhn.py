"""SVHN, cropped digits: ``train_32x32.mat`` and ``test_32x32.mat`` (MATLAB v5), ``X`` (32, 32, 3,
N) uint8 and ``y`` (N, 1) labels 1..10 (10 is the digit 0). Reading needs scipy."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from capsnet.data.idx import DatasetFileError
from capsnet.data.image_dataset import ImageDataset
from capsnet.data.sources import (
    DOWNLOAD_TIMEOUT_S,
    ProgressFn,
    RemoteFile,
    download_file,
    locate_files,
    verify_file,
)

NAME = "svhn"
CLASSES = tuple(str(digit) for digit in range(10))
IMAGE_SHAPE = (32, 32, 3)  # (H, W, C) of X's first three axes
ZERO_LABEL = 10  # SVHN's label for the digit 0
MIN_LABEL, MAX_LABEL = 1, 10
BASE_URL = "http://ufldl.stanford.edu/housenumbers"
FILES = {
    "train": RemoteFile("train_32x32.mat", (f"{BASE_URL}/train_32x32.mat",),
                        "e26dedcc434d2e4c54c9b2d4a06d8373"),
    "test": RemoteFile("test_32x32.mat", (f"{BASE_URL}/test_32x32.mat",),
                       "eb5a983be6a315427106f1b164d9cef3"),
}


def _loadmat():
    """scipy.io.loadmat, or a one-line ImportError saying how to install scipy."""
    try:
        from scipy.io import loadmat
    except ImportError as err:
        raise ImportError("reading SVHN's .mat files needs scipy: pip install scipy "
                          "(or pip install 'capsnet[datasets]')") from err
    return loadmat


def read_svhn_mat(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """One .mat file -> images (N, 3, 32, 32) uint8 and labels (N,) uint8 in 0..9;
    DatasetFileError naming the file when it is not SVHN's."""
    loadmat = _loadmat()
    try:
        contents = loadmat(os.fspath(path), variable_names=("X", "y"))
    except Exception as err:  # scipy raises ValueError, TypeError, OSError... on bad files
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DatasetFileError(path, f"cannot read MATLAB file: {reason}") from err
    if "X" not in contents or "y" not in contents:
        raise DatasetFileError(path, "expected variables X and y")
    x, y = contents["X"], contents["y"]
    if x.ndim != len(IMAGE_SHAPE) + 1 or x.shape[:-1] != IMAGE_SHAPE or x.dtype != np.uint8:
        raise DatasetFileError(path, f"expected X of shape (32, 32, 3, N) uint8, got {x.shape} "
                                     f"{x.dtype}")
    n = x.shape[-1]
    if y.size != n or y.ndim > 2 or y.dtype.kind not in "iuf":
        raise DatasetFileError(path, f"expected y of shape ({n}, 1) with integer labels, got "
                                     f"{y.shape} {y.dtype}")
    labels = y.reshape(n)  # (N,)
    out_of_range = n and (labels.min() < MIN_LABEL or labels.max() > MAX_LABEL)
    if out_of_range or (labels != labels.round()).any():
        raise DatasetFileError(path, f"labels span {labels.min()}..{labels.max()}, expected "
                                     f"integers {MIN_LABEL}..{MAX_LABEL}")
    labels = np.where(labels == ZERO_LABEL, 0, labels).astype(np.uint8)  # (N,)
    images = np.ascontiguousarray(x.transpose(3, 2, 0, 1))  # (H, W, C, N) -> (N, C, H, W)
    return images, labels


def find_mat_files(directory: Path) -> dict[str, Path] | None:
    """Both .mat files in ``directory``, keyed by split, or None unless both are there."""
    paths = {split: directory / remote.name for split, remote in FILES.items()}
    return paths if all(path.is_file() for path in paths.values()) else None


def download_svhn(dest_dir: str | os.PathLike, files: dict[str, RemoteFile] | None = None,
                  timeout: float = DOWNLOAD_TIMEOUT_S,
                  progress: ProgressFn | None = None) -> dict[str, Path]:
    """Both .mat files (default FILES) in ``dest_dir``, MD5-verified, kept when already right."""
    return {split: download_file(remote, dest_dir, timeout=timeout, progress=progress)
            for split, remote in (files or FILES).items()}


def locate_svhn(data_dir: str | os.PathLike | None = None,
                download: bool = True) -> dict[str, Path]:
    """Paths of both .mat files by split (see :func:`locate_files`); downloads when missing."""
    names = ", ".join(remote.name for remote in FILES.values())
    return locate_files(NAME, find_mat_files, download_svhn, needed=f"the two files {names}",
                        data_dir=data_dir, download=download)


def load_svhn(split: str, data_dir: str | os.PathLike | None = None, download: bool = True,
              verify: bool = False) -> ImageDataset:
    """The 'train' or 'test' split, classes "0".."9"; ``verify`` checks the file's MD5 first."""
    if split not in FILES:
        raise ValueError(f"unknown split {split!r}; expected one of {tuple(FILES)}")
    path = locate_svhn(data_dir, download)[split]
    if verify:
        verify_file(path, FILES[split].md5, decompress=False)
    images, labels = read_svhn_mat(path)
    return ImageDataset(images=torch.from_numpy(images),
                        labels=torch.from_numpy(labels.astype(np.int64)),
                        classes=CLASSES, name=NAME)
