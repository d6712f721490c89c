"""Datasets from folders of image files, laid out like torchvision's ImageFolder:
``root/train/<class>/<images>`` and optionally ``root/test/<class>/<images>``.

Classes are the train subfolders, sorted. Without ``root/test`` a seeded stratified test
split is carved out of train (``info["test_split"]``). Every file is decoded the same way
(:func:`decode_image_file`) once, and the arrays cached as ``<options hash>-<content
hash>.npz``. Problems raise :class:`FolderDatasetError` naming the file; with ``skip_bad``
unreadable files are listed in ``info["skipped"]`` instead."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from tqdm import tqdm

from capsnet.atomic import atomic_write
from capsnet.data.idx import DatasetFileError, first_line
from capsnet.data.image_dataset import CHANNEL_COUNTS, PIXEL_MAX, ImageDataset, held_out
from capsnet.data.sources import default_cache_dir

NAME = "folder"
TRAIN_DIR, TEST_DIR = "train", "test"
DEFAULT_TEST_FRACTION = 0.1
TRAIN_ORDER_SEED = 0  # the training pool's shuffled order is the same for every run
MIN_CLASSES = 2
PROGRESS_MIN_FILES = 500  # fewer files decode too fast for a progress bar to help
MAX_LISTED = 10  # skipped files named in the warning
MISSING_STAT = (-1, -1)  # (size, mtime) of a file that cannot be stat'ed: decoding reports it
# Extensions of the formats read (PNG, JPEG, BMP, GIF, TIFF, WebP), compared lower-case.
IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"})
EXTENSIONS_TEXT = " ".join(sorted(IMAGE_EXTENSIONS))
WIDE_GREY_MODES = frozenset({"I", "I;16", "I;16L", "I;16B", "I;16N"})  # 16-bit grey
ALPHA_MODES = frozenset({"RGBA", "LA", "PA", "RGBa", "La"})
WIDE_MAX = 65535
RESAMPLE = Image.Resampling.BILINEAR  # antialiased when shrinking
CACHE_SUBDIR = "folders"
CACHE_VERSION = 3  # bump when the arrays for the same files and options differ (3: shuffled)
HASH_CHARS = 24
# What reading a damaged or foreign cache file raises.
CACHE_READ_ERRORS = (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile)


class FolderDatasetError(ValueError):
    """A folder dataset that cannot be loaded; the one-line message names the file or folder."""


class BadImageError(DatasetFileError):
    """An image file that cannot be read or decoded; the message starts with the path."""


# --- one image file ------------------------------------------------------------------------

def flatten_image(image: Image.Image) -> Image.Image:
    """A decoded image in any mode -> mode L or RGB: transparency onto black, 16-bit grey
    scaled to 0..255."""
    if image.mode in WIDE_GREY_MODES:
        wide = np.asarray(image, dtype=np.float64)  # (H, W)
        scaled = np.clip(np.rint(wide * PIXEL_MAX / WIDE_MAX), 0, PIXEL_MAX).astype(np.uint8)
        return Image.fromarray(scaled)
    if image.mode in ALPHA_MODES or "transparency" in image.info:
        rgba = image.convert("RGBA")
        black = Image.new("RGBA", rgba.size, (0, 0, 0, PIXEL_MAX))
        return Image.alpha_composite(black, rgba).convert("RGB")
    return image.convert("L" if image.mode in ("1", "L") else "RGB")


def image_array(image: Image.Image, size: tuple[int, int] | None = None,
                channels: int | None = None) -> np.ndarray:
    """An image of mode L or RGB -> uint8 (C, H, W), resized to ``size`` (H, W) (aspect not
    kept) and converted to ``channels`` 1 or 3 (None: 1 when grey, RGB with equal channels)."""
    if size is not None and image.size != (size[1], size[0]):
        image = image.resize((size[1], size[0]), RESAMPLE)  # Pillow sizes are (W, H)
    if channels is not None and image.mode != ("L" if channels == 1 else "RGB"):
        image = image.convert("L" if channels == 1 else "RGB")
    array = np.asarray(image)  # (H, W) or (H, W, 3)
    if array.ndim == 2:
        return array[None].copy()  # (1, H, W)
    array = array.transpose(2, 0, 1)  # (3, H, W)
    if channels is None and (array[0] == array[1]).all() and (array[1] == array[2]).all():
        return array[:1].copy()  # (1, H, W)
    return np.ascontiguousarray(array)  # (3, H, W)


def decode_image_file(path: str | os.PathLike, size: tuple[int, int] | None = None,
                      channels: int | None = None) -> np.ndarray:
    """One image file -> uint8 (C, H, W), upright (EXIF), flattened (:func:`flatten_image`),
    sized (:func:`image_array`); decompression bombs refused; BadImageError."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(path) as image:
                image.load()
                upright = flatten_image(ImageOps.exif_transpose(image))
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as err:
            raise BadImageError(path, f"refused as a possible decompression bomb: "
                                      f"{first_line(err)}") from err
        except UnidentifiedImageError as err:
            raise BadImageError(path, "not an image Pillow can identify "
                                      "(cannot identify image file)") from err
        except OSError as err:
            raise BadImageError(path, f"cannot read image: {err.strerror or first_line(err)}"
                                ) from err
        except Exception as err:  # Pillow raises SyntaxError, ValueError, EOFError... on bad data
            raise BadImageError(path, f"cannot decode image: {first_line(err)}") from err
    return image_array(upright, size, channels)


# --- the folder's layout -------------------------------------------------------------------

@dataclass
class FolderLayout:
    """The (image file, label) pairs under ``root``, class by class, names sorted; ``test``
    None without ``root/test``."""

    root: Path
    classes: tuple[str, ...]
    train: list[tuple[Path, int]]
    test: list[tuple[Path, int]] | None

    def relative(self, path: Path) -> str:
        """``path`` relative to root, with forward slashes (as recorded in ``info``)."""
        return path.relative_to(self.root).as_posix()

    def files(self) -> list[Path]:
        return [path for path, _ in self.train + (self.test or [])]

    def stats(self) -> list[tuple[str, int, int]]:
        """(relative path, size, mtime in ns) of every file, for the cache key."""
        rows = []
        for path in self.files():
            try:
                stat = path.stat()
                size_mtime = (stat.st_size, stat.st_mtime_ns)
            except OSError:
                size_mtime = MISSING_STAT
            rows.append((self.relative(path), *size_mtime))
        return rows


def _scan_split(split_dir: Path, classes: tuple[str, ...] | None
                ) -> tuple[tuple[str, ...], list[tuple[Path, int]]]:
    """Class names and (file, label) pairs of one split folder; ``classes`` (train's) fixes
    test's labels."""
    class_dirs = sorted(entry for entry in split_dir.iterdir()
                        if entry.is_dir() and not entry.name.startswith("."))
    if not class_dirs:
        raise FolderDatasetError(f"{split_dir}: no class folders: expected "
                                 f"{split_dir}/<class name>/<image files>")
    names = tuple(d.name for d in class_dirs)
    unknown = [d for d in class_dirs if classes is not None and d.name not in classes]
    if unknown:
        raise FolderDatasetError(f"{unknown[0]}: class {unknown[0].name!r} has no folder in "
                                 f"{split_dir.parent / TRAIN_DIR} (training classes: "
                                 f"{', '.join(classes)})")
    # image files: not hidden, a known extension in any case
    per_class = [sorted(entry for entry in d.iterdir() if not entry.name.startswith(".")
                        and entry.suffix.lower() in IMAGE_EXTENSIONS and not entry.is_dir())
                 for d in class_dirs]
    if not any(per_class):
        raise FolderDatasetError(f"{split_dir}: no image files in any class folder "
                                 f"(looked for {EXTENSIONS_TEXT}, any case)")
    for class_dir, images in zip(class_dirs, per_class, strict=True):
        if not images:
            raise FolderDatasetError(f"{class_dir}: empty class folder: no image files "
                                     f"({EXTENSIONS_TEXT}, any case)")
    index = {name: i for i, name in enumerate(classes or names)}
    return names, [(path, index[d.name]) for d, images in zip(class_dirs, per_class, strict=True)
                   for path in images]


def scan_folder(root: str | os.PathLike) -> FolderLayout:
    """The classes and image files under ``root``; FolderDatasetError for a bad layout."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FolderDatasetError(f"{root}: dataset folder not found" if not root.exists()
                                 else f"{root}: not a folder")
    train_dir, test_dir = root / TRAIN_DIR, root / TEST_DIR
    if not train_dir.is_dir():
        raise FolderDatasetError(f"{train_dir}: no train folder: expected "
                                 f"{train_dir}/<class>/<images> and optionally "
                                 f"{test_dir}/<class>/<images>")
    classes, train = _scan_split(train_dir, None)
    if len(classes) < MIN_CLASSES:
        raise FolderDatasetError(f"{train_dir}: only one class folder ({classes[0]}); need at "
                                 f"least {MIN_CLASSES} classes")
    test = _scan_split(test_dir, classes)[1] if test_dir.is_dir() else None
    return FolderLayout(root, classes, train, test)


# --- decoding and splitting ----------------------------------------------------------------

def _decode_all(layout: FolderLayout, image_size: int | None, channels: int | None,
                skip_bad: bool, progress: bool) -> tuple[list[np.ndarray | None], dict[str, str]]:
    """Each file decoded to (C, H, W) uint8 or None when skipped, and skipped path -> reason;
    without ``image_size`` all images must have the first one's size."""
    files = layout.files()
    size = None if image_size is None else (image_size, image_size)
    arrays: list[np.ndarray | None] = []
    skipped: dict[str, str] = {}
    first: tuple[Path, tuple[int, int]] | None = None
    show = progress and len(files) > PROGRESS_MIN_FILES
    # disable=None: no bar when stderr is not a terminal (logs, pipes)
    for path in tqdm(files, desc=f"decoding {layout.root.name}", unit="img",
                     disable=None if show else True):
        try:
            array = decode_image_file(path, size, channels)  # (C, H, W)
        except BadImageError as err:
            if not skip_bad:
                raise FolderDatasetError(str(err)) from err
            skipped[layout.relative(path)] = err.reason
            arrays.append(None)
            continue
        height, width = array.shape[1:]
        if first is None:
            first = (path, (height, width))
        elif first[1] != (height, width):
            (h0, w0) = first[1]
            raise FolderDatasetError(f"image sizes differ: {first[0]} is {w0}x{h0} but {path} is "
                                     f"{width}x{height} (width x height); pass --image-size N "
                                     f"(image_size=N) to resize all to N x N")
        arrays.append(array)
    return arrays, skipped


def training_order(n: int) -> torch.Tensor:
    """The seeded order (n,) in which a split's n images are held."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(TRAIN_ORDER_SEED))


def _build(layout: FolderLayout, image_size: int | None, channels: int | None,
           test_fraction: float, seed: int, skip_bad: bool,
           progress: bool) -> tuple[ImageDataset, ImageDataset]:
    """Decode, stack, split: the (train, test) datasets of ``layout``."""
    arrays, skipped = _decode_all(layout, image_size, channels, skip_bad, progress)
    # (file, label, array) of the decoded files, skipped ones left out
    decoded = [(path, label, array) for (path, label), array
               in zip(layout.train + (layout.test or []), arrays, strict=True)]
    train = [item for item in decoded[:len(layout.train)] if item[2] is not None]
    test = [item for item in decoded[len(layout.train):] if item[2] is not None]
    present = {label for _, label, _ in train}
    for label, name in enumerate(layout.classes):
        if label not in present:
            count = sum(1 for path in skipped if path.startswith(f"{TRAIN_DIR}/{name}/"))
            raise FolderDatasetError(f"{layout.root / TRAIN_DIR / name}: no readable images in "
                                     f"this class folder ({count} skipped as unreadable)")
    if layout.test is not None and not test:
        raise FolderDatasetError(f"{layout.root / TEST_DIR}: no readable images "
                                 f"({len(layout.test)} skipped as unreadable)")
    kept = [array for _, _, array in train + test]
    # C = 3 if any image is RGB: a grey (1, H, W) array broadcasts into (3, H, W)
    images = np.empty((len(kept), max(a.shape[0] for a in kept), *kept[0].shape[1:]),
                      dtype=np.uint8)  # (N_train + N_test, C, H, W)
    for i, array in enumerate(kept):
        images[i] = array
    info: dict[str, Any] = {"source": NAME, "root": str(layout.root.resolve()),
                            "channels": int(images.shape[1]),
                            "image_size": [int(side) for side in images.shape[2:]],
                            "skipped": skipped}
    labels = torch.tensor([label for _, label, _ in train + test], dtype=torch.long)  # (N,)
    all_images = torch.from_numpy(images)
    if layout.test is not None:
        train_index = torch.arange(len(train))
        test_index = torch.arange(len(train), len(kept))
    else:
        train_index, test_index = held_out(labels, test_fraction, seed)
    # Folders list their images class by class; both splits are held in a seeded shuffled
    # order, as in MNIST's files, so that the first N images (--subset, the figures' first
    # test images) mix classes.
    test_index = test_index[training_order(len(test_index))]
    train_index = train_index[training_order(len(train_index))]
    if layout.test is None:
        info["test_split"] = {"seed": seed, "fraction": test_fraction,
                              "files": [layout.relative(train[i][0]) for i in test_index.tolist()]}
    return tuple(ImageDataset(all_images[index], labels[index], layout.classes, NAME,
                              copy.deepcopy(info)) for index in (train_index, test_index))


# --- the cache -----------------------------------------------------------------------------

def _digest(value: Any) -> str:
    """A short hex SHA-256 of ``value`` as canonical JSON."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]


def load_cached(path: Path, classes: tuple[str, ...]) -> tuple[ImageDataset, ImageDataset] | None:
    """The (train, test) datasets at ``path``, or None when missing, damaged or not matching."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as stored:
            meta = json.loads(str(stored["meta"]))
            if meta["key"] != path.stem or tuple(meta["classes"]) != classes:
                return None
            splits = []
            for split in (TRAIN_DIR, TEST_DIR):
                images = torch.from_numpy(stored[f"{split}_images"])  # (N, C, H, W) uint8
                labels = torch.from_numpy(stored[f"{split}_labels"])  # (N,) int64
                info = copy.deepcopy(meta["info"])
                splits.append(ImageDataset(images, labels, classes, NAME, info))
    except CACHE_READ_ERRORS:
        return None
    return splits[0], splits[1]


def save_cached(path: Path, train: ImageDataset, test: ImageDataset) -> None:
    """Write both splits atomically and remove stale files of the same options; a cache
    that cannot be written is left out."""
    meta = {"key": path.stem, "classes": list(train.classes), "info": train.info}
    arrays = {"meta": np.array(json.dumps(meta))}
    for split, dataset in ((TRAIN_DIR, train), (TEST_DIR, test)):
        arrays[f"{split}_images"] = dataset.images.numpy()
        arrays[f"{split}_labels"] = dataset.labels.numpy()
    try:
        atomic_write(path, lambda out: np.savez(out, **arrays))
    except OSError:
        return
    options_hash = path.stem.split("-")[0]
    for stale in path.parent.glob(f"{options_hash}-*{path.suffix}"):
        if stale != path:
            stale.unlink(missing_ok=True)


def load_folder_dataset(root: str | os.PathLike, image_size: int | None = None,
                        channels: int | None = None, test_fraction: float = DEFAULT_TEST_FRACTION,
                        seed: int = 0, skip_bad: bool = False,
                        cache_dir: str | os.PathLike | None = None,
                        progress: bool = True) -> tuple[ImageDataset, ImageDataset]:
    """The (train, test) datasets of an image folder: images (N, C, H, W) uint8.

    image_size: resize to N x N (None: all images must share one size); channels: 1 or 3
    (None: 1 when every image is grey); test_fraction, seed: the split made without
    root/test; skip_bad: skip unreadable files; cache_dir: default <cache dir>/folders;
    progress: a bar beyond PROGRESS_MIN_FILES files. ``info``: "source", "root",
    "channels", "image_size", "skipped" and, for a carved split, "test_split"."""
    if image_size is not None and (isinstance(image_size, bool) or not isinstance(image_size, int)
                                   or image_size < 1):
        raise ValueError(f"image_size must be a positive integer or None, got {image_size!r}")
    if channels is not None and channels not in CHANNEL_COUNTS:
        raise ValueError(f"channels must be one of {CHANNEL_COUNTS} or None, got {channels!r}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction!r}")
    layout = scan_folder(root)
    # the options hash covers the folder and the options, the content hash every file's
    # relative path, size and mtime
    options = {"version": CACHE_VERSION, "root": str(layout.root.resolve()),
               "image_size": image_size, "channels": channels, "skip_bad": skip_bad,
               "seed": seed, "test_fraction": test_fraction}
    base = (Path(cache_dir).expanduser() if cache_dir is not None
            else default_cache_dir() / CACHE_SUBDIR)
    path = base / f"{_digest(options)}-{_digest(sorted(layout.stats()))}.npz"
    cached = load_cached(path, layout.classes)
    if cached is not None:
        return cached
    train, test = _build(layout, image_size, channels, test_fraction, seed, skip_bad, progress)
    save_cached(path, train, test)
    return train, test


def format_skipped_warning(info: dict[str, Any], limit: int = MAX_LISTED) -> str | None:
    """One line naming the skipped files (up to ``limit``), or None when none were."""
    skipped = info.get("skipped") or {}
    if not skipped:
        return None
    listed = "; ".join(f"{path} ({reason})" for path, reason in list(skipped.items())[:limit])
    more = f"; and {len(skipped) - limit} more" if len(skipped) > limit else ""
    noun = "file" if len(skipped) == 1 else "files"
    return (f"warning: skipped {len(skipped)} unreadable image {noun} under "
            f"{info.get('root', 'the dataset folder')}: {listed}{more}")
