"""Reading and writing IDX files (MNIST, Fashion-MNIST): magic ``00 00 <type> <ndim>``,
big-endian uint32 sizes, then the big-endian payload in C order; raw or gzip (told by its
magic bytes). Every problem raises :class:`IDXError`, one line starting with the path."""

from __future__ import annotations

import gzip
import math
import os
import zlib
from typing import BinaryIO

import numpy as np

GZIP_MAGIC = b"\x1f\x8b"
GZIP_SUFFIX = ".gz"
MAGIC_SIZE = 4
DIM_SIZE = 4  # each dimension size is a big-endian uint32
MAX_NDIM = 8
MAX_BYTES = 1 << 31  # a header claiming more is refused before allocating

# IDX type code -> big-endian numpy dtype of the payload.
TYPE_CODES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
DTYPE_CODES: dict[np.dtype, int] = {dt.newbyteorder("="): code for code, dt in TYPE_CODES.items()}

# What a damaged gzip stream raises while being decompressed.
GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error, OSError)


def first_line(err: BaseException) -> str:
    """The first line of an exception's message, else its type's name."""
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


class DatasetFileError(ValueError):
    """A dataset file that is missing, unreadable or malformed; the message starts with the path."""

    def __init__(self, path: str | os.PathLike, reason: str):
        super().__init__(f"{os.fspath(path)}: {reason}")
        self.path = os.fspath(path)
        self.reason = reason

    def __reduce__(self):
        """Pickle by the constructor's arguments (exceptions cross process boundaries)."""
        return type(self), (self.path, self.reason)


class IDXError(DatasetFileError):
    """A file that is missing, unreadable or not a valid IDX file; message names the file."""


def open_maybe_gzip(path: str | os.PathLike, decompress: bool = True) -> BinaryIO:
    """Open ``path`` for binary reading, decompressed when gzip (unless ``decompress`` is
    False); IDXError when it cannot be opened."""
    try:
        with open(path, "rb") as f:
            packed = decompress and f.read(len(GZIP_MAGIC)) == GZIP_MAGIC
        return gzip.open(path, "rb") if packed else open(path, "rb")
    except FileNotFoundError as err:
        raise IDXError(path, "file not found") from err
    except OSError as err:
        raise IDXError(path, f"cannot open file: {err.strerror or err}") from err


def _read_header(f: BinaryIO, path: str | os.PathLike) -> tuple[np.dtype, tuple[int, ...]]:
    """Parse the magic number and the dimension sizes; returns (big-endian dtype, shape)."""
    magic = f.read(MAGIC_SIZE)  # buffered reads return fewer bytes only at the end
    if not magic:
        raise IDXError(path, "empty file")
    if len(magic) < MAGIC_SIZE:
        raise IDXError(path, f"truncated IDX header: {len(magic)} of {MAGIC_SIZE} magic bytes")
    if magic[:2] != b"\x00\x00":
        raise IDXError(path, f"not an IDX file: magic {magic.hex()} does not start with 0000")
    type_code, ndim = magic[2], magic[3]
    if type_code not in TYPE_CODES:
        known = ", ".join(f"0x{c:02X}" for c in TYPE_CODES)
        raise IDXError(path, f"unknown IDX type code 0x{type_code:02X} (known: {known})")
    if not 1 <= ndim <= MAX_NDIM:
        raise IDXError(path, f"IDX header has {ndim} dimensions, expected 1..{MAX_NDIM}")
    raw_dims = f.read(ndim * DIM_SIZE)
    if len(raw_dims) < ndim * DIM_SIZE:
        raise IDXError(path, f"truncated IDX header: {ndim} dimensions need "
                             f"{ndim * DIM_SIZE} bytes, found {len(raw_dims)}")
    shape = tuple(int(d) for d in np.frombuffer(raw_dims, dtype=">u4"))
    if any(d == 0 for d in shape):
        raise IDXError(path, f"IDX header has a zero dimension size: {shape}")
    return TYPE_CODES[type_code], shape


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An IDX file (raw or gzip) -> a native-endian array of its dims; IDXError for every
    problem, a header claiming more than MAX_BYTES included."""
    with open_maybe_gzip(path) as f:
        try:
            dtype, shape = _read_header(f, path)
            claimed = math.prod(shape) * dtype.itemsize  # Python ints: no overflow
            if claimed > MAX_BYTES:
                raise IDXError(path, f"header claims {claimed} bytes, "
                                     f"more than the limit {MAX_BYTES}")
            array = np.empty(shape, dtype=dtype)
            filled = f.readinto(memoryview(array).cast("B"))  # short only at the end
            if filled < claimed:
                raise IDXError(path, f"truncated IDX file: header claims {claimed} bytes of "
                                     f"data, found {filled}")
            if f.read(1):
                raise IDXError(path, f"IDX file has trailing bytes after the {claimed} bytes "
                                     f"of data its header claims")
        except GZIP_ERRORS as err:
            kind = "corrupt gzip data" if isinstance(f, gzip.GzipFile) else "read error"
            raise IDXError(path, f"{kind}: {err}") from err
    return array.astype(dtype.newbyteorder("="), copy=False)
