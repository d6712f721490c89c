"""Image files made in memory, for the preprocessing and web tests, and a tiny colour model."""
from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

COLOUR_CLASSES = ("blue", "green", "red")  # sorted, as the folder reader orders classes
CHANNEL_OF = {"red": 0, "green": 1, "blue": 2}


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


def train_colour_model(root: Path) -> Path:
    """The small CapsNet trained one epoch on a folder of 32x32 colour images made under
    ``root`` (each class a bar of its colour on dark noise); returns its best.pt."""
    from capsnet.training import TrainSettings, fit

    rng = np.random.default_rng(0)
    for name in COLOUR_CLASSES:
        (root / "data" / "train" / name).mkdir(parents=True)
        for i in range(6):
            pixels = rng.integers(0, 40, (32, 32, 3), dtype=np.uint8)  # (H, W, 3)
            pixels[10:16, 4:28, CHANNEL_OF[name]] = 230
            Image.fromarray(pixels).save(root / "data" / "train" / name / f"{i}.png")
    fit(TrainSettings(dataset="folder", data_dir=str(root / "data"), preset="small", epochs=1,
                      batch_size=6, val_size=3, out_dir=str(root / "run"), progress=False,
                      precision="fp32"), log=lambda _: None)
    return root / "run" / "best.pt"


def colour_bar_png(rgb: tuple[int, int, int] = (20, 230, 20)) -> bytes:
    """A bar of colour ``rgb`` on black, 64x48 (not a model's size), as an upload."""
    image = Image.new("RGB", (64, 48))
    image.paste(rgb, (8, 15, 57, 25))
    return encoded(image)
