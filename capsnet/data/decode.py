"""Image files -> uint8 arrays (C, H, W), the same conventions for every file: EXIF orientation
applied; transparency onto black; 16-bit grey scaled to 0..255; grey is mode L or RGB with
equal channels; resizing antialiased bilinear (aspect not kept); decompression bombs
refused. Problems raise :class:`BadImageError`, one line starting with the path."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from capsnet.data.idx import DatasetFileError
from capsnet.data.image_dataset import PIXEL_MAX

# Extensions of the formats read (PNG, JPEG, BMP, GIF, TIFF, WebP), compared lower-case.
IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"})
BACKGROUND = 0  # transparent pixels are flattened onto black
GREY_MODES = frozenset({"1", "L"})
WIDE_GREY_MODES = frozenset({"I", "I;16", "I;16L", "I;16B", "I;16N"})  # 16-bit grey
ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
WIDE_MAX = 65535
RESAMPLE = Image.Resampling.BILINEAR  # antialiased when shrinking
GREY, RGB = 1, 3  # channel counts


class BadImageError(DatasetFileError):
    """An image file that cannot be read or decoded; the message starts with the path."""


def is_image_file(path: Path) -> bool:
    """True for a non-hidden entry whose extension (any case) is in IMAGE_EXTENSIONS."""
    return not path.name.startswith(".") and path.suffix.lower() in IMAGE_EXTENSIONS


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def flatten_image(image: Image.Image) -> Image.Image:
    """A decoded image in any mode -> mode L or RGB (see the module docstring)."""
    if image.mode in WIDE_GREY_MODES:
        wide = np.asarray(image, dtype=np.float64)  # (H, W)
        scaled = np.clip(np.rint(wide * PIXEL_MAX / WIDE_MAX), 0, PIXEL_MAX).astype(np.uint8)
        return Image.fromarray(scaled)
    if image.mode in ALPHA_MODES or "transparency" in image.info:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (BACKGROUND, BACKGROUND, BACKGROUND, PIXEL_MAX))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if image.mode in GREY_MODES:
        return image.convert("L")
    return image.convert("RGB")


def open_image(path: str | os.PathLike) -> Image.Image:
    """Decode the whole file: upright, transparency flattened, mode L or RGB; BadImageError."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(path) as image:
                image.load()
                return flatten_image(ImageOps.exif_transpose(image))
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
            raise BadImageError(path, f"refused as a possible decompression bomb: "
                                      f"{_first_line(err)}") from err
        except UnidentifiedImageError as err:
            raise BadImageError(path, "not an image Pillow can identify "
                                      "(cannot identify image file)") from err
        except OSError as err:
            reason = err.strerror or _first_line(err)
            raise BadImageError(path, f"cannot read image: {reason}") from err
        except Exception as err:  # Pillow raises SyntaxError, ValueError, EOFError... on bad data
            raise BadImageError(path, f"cannot decode image: {_first_line(err)}") from err


def decode_image_file(path: str | os.PathLike, size: tuple[int, int] | None = None,
                      channels: int | None = None) -> np.ndarray:
    """One image file -> uint8 (C, H, W); ``size`` (H, W) resizes, ``channels`` 1 or 3 converts
    (None: 1 for grey, 3 for colour). BadImageError."""
    return image_array(open_image(path), size, channels)


def image_array(image: Image.Image, size: tuple[int, int] | None = None,
                channels: int | None = None) -> np.ndarray:
    """An image of mode L or RGB -> uint8 (C, H, W), resized and converted."""
    if size is not None and image.size != (size[1], size[0]):
        image = image.resize((size[1], size[0]), RESAMPLE)  # Pillow sizes are (W, H)
    if channels == GREY and image.mode != "L":
        image = image.convert("L")
    elif channels == RGB and image.mode != "RGB":
        image = image.convert("RGB")
    array = np.asarray(image)  # (H, W) or (H, W, 3)
    if array.ndim == 2:
        return array[None].copy()  # (1, H, W)
    array = array.transpose(2, 0, 1)  # (3, H, W)
    if channels is None and (array[0] == array[1]).all() and (array[1] == array[2]).all():
        return array[:1].copy()  # (1, H, W)
    return np.ascontiguousarray(array)  # (3, H, W)
