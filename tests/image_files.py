"""Image files made in memory, for the preprocessing and web tests."""
from __future__ import annotations

import io
import struct
import zlib

from PIL import Image


def encoded(image: Image.Image, fmt: str = "PNG", **kwargs) -> bytes:
    """``image`` saved in ``fmt`` to bytes."""
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height pixels, with no pixel data at all."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")
