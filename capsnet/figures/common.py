"""What every figure shares: the PNG writer, colours, sizes, tiling of images (uint8,
(H, W) grey or (H, W, 3) RGB) and class labels, on ``matplotlib.figure.Figure`` (Agg),
never pyplot."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from capsnet.atomic import atomic_path
from capsnet.data.image_dataset import PIXEL_MAX

DPI = 100
WRONG_COLOR = "tab:red"
RIGHT_COLOR = "black"
WINNER_COLOR = "tab:blue"
OTHER_COLOR = "tab:gray"
PAD_VALUE = 128  # grey separator between tiles of a mosaic
PERCENT = 100.0
TITLE_FONTSIZE = 9


def save_figure(fig: Figure, path: str | os.PathLike, title: str | None = None) -> Path:
    """Write ``fig``, under ``title`` if given, as a PNG at ``path``, atomically (folders made
    as needed); returns the path."""
    if title:
        fig.suptitle(title, fontsize=TITLE_FONTSIZE)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
    return Path(path)


def mosaic(tiles: np.ndarray, pad: int = 1, pad_value: int = PAD_VALUE) -> np.ndarray:
    """Tiles (R, C, H, W[, 3]) -> one image (R*(H+pad)-pad, C*(W+pad)-pad[, 3]) with separators."""
    R, C, H, W = tiles.shape[:4]
    out = np.full((R * (H + pad) - pad, C * (W + pad) - pad, *tiles.shape[4:]), pad_value,
                  dtype=tiles.dtype)
    for r in range(R):
        for c in range(C):
            out[r * (H + pad):r * (H + pad) + H, c * (W + pad):c * (W + pad) + W] = tiles[r, c]
    return out


def draw_image(ax, image: np.ndarray) -> None:
    """An image (H, W) grey or (H, W, 3) RGB uint8 on ``ax``."""
    if image.ndim == 2:
        ax.imshow(image, cmap="gray", vmin=0, vmax=PIXEL_MAX, interpolation="nearest")
    else:
        ax.imshow(image, interpolation="nearest")


def show_image(ax, image: np.ndarray, title: str | None = None, color: str = RIGHT_COLOR) -> None:
    """An image (H, W) or (H, W, 3) uint8 without ticks, with an optional title."""
    draw_image(ax, image)
    ax.set_xticks([])
    ax.set_yticks([])
    if title is not None:
        ax.set_title(title, fontsize=8, color=color)


def short_label(text: str, limit: int = 12) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis marks the cut), for tiny titles."""
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def class_label(index: int, class_names: Sequence[str] | None) -> str:
    """Class ``index`` by its (shortened) name, or as a number without names."""
    return short_label(class_names[int(index)]) if class_names else str(int(index))
