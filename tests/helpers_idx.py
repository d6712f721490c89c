"""The tests' IDX writer (the library only reads IDX files): arrays as IDX files, raw or
gzipped, to build fake MNIST-format datasets and corrupt ones."""
from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from capsnet.atomic import atomic_write
from capsnet.data.idx import DTYPE_CODES, GZIP_SUFFIX, MAX_NDIM

GZIP_LEVEL = 6  # zlib's default: 9 is several times slower for a few percent


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write ``array`` as an IDX file, atomically, gzip when ``path`` ends in ``.gz``."""
    array = np.asarray(array)
    code = DTYPE_CODES.get(array.dtype.newbyteorder("="))
    if code is None:
        known = ", ".join(str(dt) for dt in DTYPE_CODES)
        raise ValueError(f"IDX cannot store dtype {array.dtype} (supported: {known})")
    if not 1 <= array.ndim <= MAX_NDIM or 0 in array.shape:
        raise ValueError(f"IDX needs 1..{MAX_NDIM} non-zero dimensions, got shape {array.shape}")
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    payload = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder(">")).tobytes()

    def write(raw) -> None:
        if Path(path).name.endswith(GZIP_SUFFIX):
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=GZIP_LEVEL, mtime=0) as gz:
                gz.write(header + payload)
        else:
            raw.write(header + payload)

    atomic_write(path, write)
