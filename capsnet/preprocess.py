"""Your own images -> a model's input: :func:`prepare_for_model` picks the way.

A grey digit model gets the digit made as MNIST was (:func:`prepare_image`): grayscale,
dark-on-light inverted, background removed, cropped to the ink, scaled to fit 20x20 and
centred by centre of mass in 28x28. Every other model gets the whole image as the folder
reader decodes a training file (:func:`prepare_plain`). Anything unusable (not an image,
truncated, over MAX_PIXELS, checked before decoding, or no ink) raises PreprocessError."""
from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from capsnet.data.folder import RESAMPLE, flatten_image, image_array
from capsnet.data.idx import first_line
from capsnet.data.image_dataset import PIXEL_MAX
from capsnet.data.model_view import is_digit_model
from capsnet.data.transforms import center_crop

MNIST_SIZE = 28  # side of the output field
FIT_SIZE = 20  # the digit's longer side after scaling
MAX_PIXELS = 50_000_000  # larger images are refused before they are decoded
WORK_SIZE = 1024  # larger images are shrunk to this longer side before the pixel work
BORDER_FRACTION = 0.05  # width of the border ring that estimates the background
INK_PERCENTILE = 99.5  # the ink's brightness, robust to a few hot pixels
MIN_CONTRAST = 40  # grey levels (of 255) between background and ink, else "no ink"
NOISE_FRACTION = 0.25  # stretched values below this are background noise -> 0
MID_GREY = 128

ImageSource = str | os.PathLike | bytes | bytearray | Image.Image | np.ndarray


class PreprocessError(ValueError):
    """An input that cannot be turned into a digit image (one line, names the input)."""


class ImageTooLargeError(PreprocessError):
    """An image with more than MAX_PIXELS pixels, refused before its pixels are decoded."""


def decoded(source: str | os.PathLike | bytes | bytearray | Image.Image,
            convert: Callable[[Image.Image], np.ndarray]) -> np.ndarray:
    """``convert`` of the decoded image of a path, bytes or PIL image; PreprocessError."""
    if isinstance(source, Image.Image):
        return convert(_checked_load(source))
    if isinstance(source, (bytes, bytearray)):
        if not source:
            raise PreprocessError("empty file")
        stream = io.BytesIO(source)
    else:
        path = Path(source)
        if not path.is_file():
            raise PreprocessError("no such file" if not path.exists() else "not a file")
        if path.stat().st_size == 0:
            raise PreprocessError("empty file")
        stream = path
    try:
        image = Image.open(stream)
    except UnidentifiedImageError:
        raise PreprocessError("not an image (Pillow cannot identify its format)") from None
    except Image.DecompressionBombError:
        raise ImageTooLargeError(f"image too large: far over the limit of {MAX_PIXELS:,} "
                                 "pixels") from None
    except Exception as exc:  # a header Pillow recognises but cannot parse
        raise PreprocessError(f"unreadable image ({first_line(exc)})") from None
    with image:
        return convert(_checked_load(image))


def _checked_load(image: Image.Image) -> Image.Image:
    """Refuse images over MAX_PIXELS, then decode the pixels (JPEG at a reduced scale)."""
    width, height = image.size
    if width * height > MAX_PIXELS:
        raise ImageTooLargeError(f"image too large: {width}x{height} pixels is over the limit of "
                                 f"{MAX_PIXELS:,}")
    if width == 0 or height == 0:
        raise PreprocessError("image has no pixels")
    try:
        image.draft(None, (WORK_SIZE, WORK_SIZE))  # JPEG only: decode at 1/2, 1/4 or 1/8
        image.load()
    except Exception as exc:  # Pillow raises OSError, SyntaxError, EOFError... when truncated
        raise PreprocessError(f"truncated or corrupt image ({first_line(exc)})") from None
    return image


def to_grayscale(image: Image.Image) -> np.ndarray:
    """A decoded image -> upright float32 (H, W) grey levels in [0, 255], at most WORK_SIZE;
    transparency onto white (onto black if that leaves no contrast); 16-bit/float rescaled."""
    image = ImageOps.exif_transpose(image)
    if max(image.size) > WORK_SIZE:
        image = image.copy()
        image.thumbnail((WORK_SIZE, WORK_SIZE), Image.Resampling.BOX)
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        alpha = np.asarray(rgba.getchannel("A"), dtype=np.float32) / PIXEL_MAX  # (H, W)
        grey = np.asarray(rgba.convert("L"), dtype=np.float32)  # (H, W)
        on_white = grey * alpha + PIXEL_MAX * (1 - alpha)  # (H, W)
        if np.ptp(on_white) >= MIN_CONTRAST:
            return on_white
        return grey * alpha  # (H, W) on black
    if image.mode.startswith("I") or image.mode == "F":  # 16/32-bit integer or float grey
        grey = np.asarray(image, dtype=np.float32)  # (H, W)
        peak = float(grey.max())
        return grey * (PIXEL_MAX / peak) if peak > PIXEL_MAX else grey
    return np.asarray(image.convert("L"), dtype=np.float32)  # (H, W)


def ink_map(grey: np.ndarray) -> np.ndarray:
    """Grey levels (H, W) -> ink (H, W) in [0, 1] on a zero background (border median);
    light backgrounds inverted; PreprocessError when there is too little contrast."""
    H, W = grey.shape
    ring = max(1, round(BORDER_FRACTION * min(H, W)))
    border = np.concatenate([grey[:ring].ravel(), grey[-ring:].ravel(),
                             grey[:, :ring].ravel(), grey[:, -ring:].ravel()])
    background = float(np.median(border))
    if background >= MID_GREY:  # dark ink on light paper
        grey, background = PIXEL_MAX - grey, PIXEL_MAX - background  # (H, W)
    ink_level = float(np.percentile(grey, INK_PERCENTILE))
    if ink_level - background < MIN_CONTRAST:
        ink_level = float(grey.max())  # a thin stroke may be fewer pixels than the percentile
    if ink_level - background < MIN_CONTRAST:
        raise PreprocessError("no ink found: the image is blank or has too little contrast")
    ink = np.clip((grey - background) / (ink_level - background), 0.0, 1.0)  # (H, W)
    ink[ink < NOISE_FRACTION] = 0.0
    return ink


def fit_to_box(ink: np.ndarray) -> np.ndarray:
    """Ink (H, W) cropped to its bounding box and scaled so its longer side is FIT_SIZE
    -> (h, w) float32, max 1."""
    rows = np.flatnonzero(ink.any(axis=1))  # never empty: ink_map found ink
    cols = np.flatnonzero(ink.any(axis=0))
    crop = ink[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]  # (h0, w0)
    h0, w0 = crop.shape
    scale = FIT_SIZE / max(h0, w0)
    size = (max(1, round(w0 * scale)), max(1, round(h0 * scale)))  # PIL's (width, height)
    resized = Image.fromarray(crop.astype(np.float32)).resize(
        size, Image.Resampling.LANCZOS, reducing_gap=None if scale >= 1 else 2.0)
    digit = np.clip(np.asarray(resized, dtype=np.float32), 0.0, None)  # (h, w)
    peak = float(digit.max())
    if peak <= 0:
        raise PreprocessError("no ink found after scaling")
    return np.minimum(digit / peak, 1.0)


def center_by_mass(digit: np.ndarray) -> np.ndarray:
    """Digit (h, w) pasted into (28, 28) float32 with its centre of mass at (14, 14), where
    MNIST's own digits have theirs."""
    h, w = digit.shape
    total = float(digit.sum())
    com_y = float((digit.sum(axis=1) * np.arange(h)).sum()) / total
    com_x = float((digit.sum(axis=0) * np.arange(w)).sum()) / total
    top = int(np.clip(round(MNIST_SIZE / 2 - com_y), 0, MNIST_SIZE - h))
    left = int(np.clip(round(MNIST_SIZE / 2 - com_x), 0, MNIST_SIZE - w))
    field = np.zeros((MNIST_SIZE, MNIST_SIZE), dtype=np.float32)  # (28, 28)
    field[top:top + h, left:left + w] = digit
    return field


def prepare_image(source: ImageSource) -> np.ndarray:
    """A photo or scan of one digit (path, bytes, PIL image or grey array (H, W) of levels
    0..255, any polarity) -> MNIST-like uint8 (28, 28), white on black."""
    if isinstance(source, np.ndarray):
        grey = np.asarray(source, dtype=np.float32)
    else:
        grey = decoded(source, to_grayscale)  # (H, W)
    if grey.ndim != 2:
        raise PreprocessError(f"expected a 2-D grey image, got shape {tuple(grey.shape)}")
    if grey.size == 0:
        raise PreprocessError("image has no pixels")
    field = center_by_mass(fit_to_box(ink_map(grey)))  # (28, 28) in [0, 1]
    return np.round(field * PIXEL_MAX).astype(np.uint8)


def prepare_plain(source: ImageSource, size: int, channels: int) -> np.ndarray:
    """Any image -> uint8 (channels, size, size) as the folder reader decodes a file:
    upright, transparency onto black, grey or RGB, resized (aspect ratio not kept)."""
    def convert(image: Image.Image) -> np.ndarray:
        return image_array(flatten_image(ImageOps.exif_transpose(image)), (size, size), channels)

    if not isinstance(source, np.ndarray):
        return decoded(source, convert)
    if not (source.ndim == 2 or (source.ndim == 3 and source.shape[-1] == 3)):
        raise PreprocessError(f"expected an image array (H, W) or (H, W, 3), got shape "
                              f"{tuple(source.shape)}")
    if source.size == 0:
        raise PreprocessError("image has no pixels")
    return convert(Image.fromarray(np.clip(np.round(source), 0, PIXEL_MAX).astype(np.uint8)))


def fit_digit(field: np.ndarray, size: int) -> np.ndarray:
    """A (28, 28) digit for a ``size`` input: centred on black when larger, resized when smaller."""
    side = field.shape[0]
    if size < side:
        return np.asarray(Image.fromarray(field).resize((size, size), RESAMPLE))
    top = (size - side) // 2
    return np.pad(field, ((top, size - side - top),) * 2)  # (size, size)


def prepare_for_model(source: ImageSource, config) -> np.ndarray:
    """An own image -> uint8 (C, H, W) for the model with ``config`` (digit or plain
    preparation, then the centre crop of a model trained on crops)."""
    side = config.uncropped_size or config.image_size
    if is_digit_model(config):
        image = fit_digit(prepare_image(source), side)[None]  # (1, side, side)
    else:
        image = prepare_plain(source, side, config.in_channels)  # (C, side, side)
    return np.ascontiguousarray(center_crop(image, config.image_size))  # (C, H, W)
