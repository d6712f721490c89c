"""The decoded arrays of an image folder, cached as ``<options hash>-<content hash>.npz``.

The options hash covers the folder's path and the decoding options, the content hash each
file's relative path, size and mtime. Writing removes stale files of the same options;
files are written atomically and read with ``allow_pickle=False``; bad ones are ignored."""

from __future__ import annotations

import copy
import hashlib
import json
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from capsnet.atomic import atomic_write
from capsnet.data.image_dataset import ImageDataset

CACHE_VERSION = 3  # bump when the arrays for the same files and options differ (3: shuffled)
HASH_CHARS = 24
SUFFIX = ".npz"
SPLITS = ("train", "test")
# What reading a damaged or foreign cache file raises.
READ_ERRORS = (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile)


def _digest(value: Any) -> str:
    """A short hex SHA-256 of ``value`` as canonical JSON."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]


def cache_path(cache_dir: Path, root: Path, options: Mapping[str, Any],
               files: Sequence[tuple[str, int, int]]) -> Path:
    """The cache file for ``root`` with ``options`` and ``files`` (path, size, mtime ns)."""
    options_hash = _digest({"version": CACHE_VERSION, "root": str(root.resolve()), **options})
    return cache_dir / f"{options_hash}-{_digest(sorted(files))}{SUFFIX}"


def load_cached(path: Path, classes: tuple[str, ...],
                name: str) -> tuple[ImageDataset, ImageDataset] | None:
    """The (train, test) datasets at ``path``, or None when missing, damaged or not matching."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as stored:
            meta = json.loads(str(stored["meta"]))
            if meta["key"] != path.stem or tuple(meta["classes"]) != classes:
                return None
            splits = []
            for split in SPLITS:
                images = stored[f"{split}_images"]  # (N, C, H, W) uint8
                labels = stored[f"{split}_labels"]  # (N,) int64
                if images.dtype != np.uint8 or labels.dtype != np.int64 or images.ndim != 4:
                    return None
                if len(labels) and (labels.min() < 0 or labels.max() >= len(classes)):
                    return None
                splits.append(ImageDataset(torch.from_numpy(images), torch.from_numpy(labels),
                                           classes, name, copy.deepcopy(meta["info"])))
    except READ_ERRORS:
        return None
    train, test = splits
    return train, test


def save_cached(path: Path, train: ImageDataset, test: ImageDataset) -> bool:
    """Write both splits atomically, removing stale files; False when it cannot be written."""
    meta = {"key": path.stem, "classes": list(train.classes), "info": train.info}
    arrays = {"meta": np.array(json.dumps(meta))}
    for split, dataset in zip(SPLITS, (train, test), strict=True):
        arrays[f"{split}_images"] = dataset.images.numpy()
        arrays[f"{split}_labels"] = dataset.labels.numpy()
    try:
        atomic_write(path, lambda out: np.savez(out, **arrays))
    except OSError:
        return False
    options_hash = path.stem.split("-")[0]
    for stale in path.parent.glob(f"{options_hash}-*{SUFFIX}"):
        if stale != path:
            stale.unlink(missing_ok=True)
    return True
