"""Datasets from folders of image files, laid out like torchvision's ImageFolder:
``root/train/<class>/<images>`` and optionally ``root/test/<class>/<images>``.

Classes are the train subfolders, sorted. Without ``root/test`` a seeded stratified test
split is carved out of train (``info["test_split"]``). Files are decoded once
(capsnet.data.decode) and cached (capsnet.data.folder_cache). Problems raise
:class:`FolderDatasetError` naming the file; with ``skip_bad`` unreadable files are listed
in ``info["skipped"]`` instead."""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from capsnet.data.decode import IMAGE_EXTENSIONS, BadImageError, decode_image_file, is_image_file
from capsnet.data.folder_cache import cache_path, load_cached, save_cached
from capsnet.data.image_dataset import ImageDataset, held_out
from capsnet.data.sources import default_cache_dir

NAME = "folder"
TRAIN_DIR, TEST_DIR = "train", "test"
CACHE_SUBDIR = "folders"
DEFAULT_TEST_FRACTION = 0.1
TRAIN_ORDER_SEED = 0  # the training pool's shuffled order is the same for every run
MIN_CLASSES = 2
CHANNEL_CHOICES = (1, 3)
PROGRESS_MIN_FILES = 500  # fewer files decode too fast for a progress bar to help
MAX_LISTED = 10  # skipped files named in the warning
MISSING_STAT = (-1, -1)  # (size, mtime) of a file that cannot be stat'ed: decoding reports it
EXTENSIONS_TEXT = " ".join(sorted(IMAGE_EXTENSIONS))


class FolderDatasetError(ValueError):
    """A folder dataset that cannot be loaded; the one-line message names the file or folder."""


@dataclass
class FolderLayout:
    """The image files under ``root``, class by class, names sorted; ``test_files`` None
    without ``root/test``."""

    root: Path
    classes: tuple[str, ...]
    train_files: list[Path]
    train_labels: list[int]
    test_files: list[Path] | None
    test_labels: list[int] | None

    def relative(self, path: Path) -> str:
        """``path`` relative to root, with forward slashes (as recorded in ``info``)."""
        return path.relative_to(self.root).as_posix()

    def all_files(self) -> list[Path]:
        return self.train_files + (self.test_files or [])

    def stats(self) -> list[tuple[str, int, int]]:
        """(relative path, size, mtime in ns) of every file, for the cache key."""
        rows = []
        for path in self.all_files():
            try:
                stat = path.stat()
                size_mtime = (stat.st_size, stat.st_mtime_ns)
            except OSError:
                size_mtime = MISSING_STAT
            rows.append((self.relative(path), *size_mtime))
        return rows


def _subdirs(folder: Path) -> list[Path]:
    return sorted(entry for entry in folder.iterdir()
                  if entry.is_dir() and not entry.name.startswith("."))


def _images_in(folder: Path) -> list[Path]:
    return sorted(entry for entry in folder.iterdir()
                  if is_image_file(entry) and not entry.is_dir())


def _scan_split(split_dir: Path, classes: tuple[str, ...] | None
                ) -> tuple[tuple[str, ...], list[Path], list[int]]:
    """Class names, files and labels of one split folder; ``classes`` (train's) fixes test's."""
    class_dirs = _subdirs(split_dir)
    if not class_dirs:
        raise FolderDatasetError(f"{split_dir}: no class folders: expected "
                                 f"{split_dir}/<class name>/<image files>")
    names = tuple(d.name for d in class_dirs)
    if classes is not None:
        unknown = [d for d in class_dirs if d.name not in classes]
        if unknown:
            raise FolderDatasetError(f"{unknown[0]}: class {unknown[0].name!r} has no folder in "
                                     f"{split_dir.parent / TRAIN_DIR} (training classes: "
                                     f"{', '.join(classes)})")
    per_class = [_images_in(d) for d in class_dirs]
    if not any(per_class):
        raise FolderDatasetError(f"{split_dir}: no image files in any class folder "
                                 f"(looked for {EXTENSIONS_TEXT}, any case)")
    for class_dir, images in zip(class_dirs, per_class, strict=True):
        if not images:
            raise FolderDatasetError(f"{class_dir}: empty class folder: no image files "
                                     f"({EXTENSIONS_TEXT}, any case)")
    index = {name: i for i, name in enumerate(classes or names)}
    files = [path for images in per_class for path in images]
    labels = [index[d.name] for d, images in zip(class_dirs, per_class, strict=True)
              for _ in images]
    return names, files, labels


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
    classes, train_files, train_labels = _scan_split(train_dir, None)
    if len(classes) < MIN_CLASSES:
        raise FolderDatasetError(f"{train_dir}: only one class folder ({classes[0]}); need at "
                                 f"least {MIN_CLASSES} classes")
    test_files = test_labels = None
    if test_dir.is_dir():
        _, test_files, test_labels = _scan_split(test_dir, classes)
    return FolderLayout(root, classes, train_files, train_labels, test_files, test_labels)


def _decode_all(layout: FolderLayout, image_size: int | None, channels: int | None,
                skip_bad: bool, progress: bool) -> tuple[list[np.ndarray | None], dict[str, str]]:
    """Each file decoded to (C, H, W) uint8 or None when skipped, and skipped path -> reason;
    without ``image_size`` all images must have the first one's size."""
    files = layout.all_files()
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


def _stack(arrays: list[np.ndarray]) -> np.ndarray:
    """(C, H, W) arrays -> (N, C, H, W) uint8, C = 3 if any is RGB (grey ones repeated)."""
    channels = max(array.shape[0] for array in arrays)
    height, width = arrays[0].shape[1:]
    out = np.empty((len(arrays), channels, height, width), dtype=np.uint8)  # (N, C, H, W)
    for i, array in enumerate(arrays):
        out[i] = array  # (1, H, W) broadcasts to (3, H, W)
    return out


def _keep(files: list[Path], labels: list[int], arrays: list[np.ndarray | None]):
    """The decoded (file, label, array) triples, skipped ones left out."""
    return [(f, y, a) for f, y, a in zip(files, labels, arrays, strict=True) if a is not None]


def _check_classes_left(layout: FolderLayout, labels: list[int], skipped: dict[str, str]) -> None:
    """Raise when skipping unreadable files left a training class without images."""
    present = set(labels)
    for label, name in enumerate(layout.classes):
        if label not in present:
            folder = layout.root / TRAIN_DIR / name
            count = sum(1 for path in skipped if path.startswith(f"{TRAIN_DIR}/{name}/"))
            raise FolderDatasetError(f"{folder}: no readable images in this class folder "
                                     f"({count} skipped as unreadable)")


def training_order(n: int) -> torch.Tensor:
    """The seeded order (n,) in which a split's n images are held."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(TRAIN_ORDER_SEED))


def _build(layout: FolderLayout, image_size: int | None, channels: int | None,
           test_fraction: float, seed: int, skip_bad: bool,
           progress: bool) -> tuple[ImageDataset, ImageDataset]:
    """Decode, stack, split: the (train, test) datasets of ``layout``."""
    arrays, skipped = _decode_all(layout, image_size, channels, skip_bad, progress)
    n_train = len(layout.train_files)
    train = _keep(layout.train_files, layout.train_labels, arrays[:n_train])
    _check_classes_left(layout, [y for _, y, _ in train], skipped)
    has_test = layout.test_files is not None
    test = _keep(layout.test_files, layout.test_labels, arrays[n_train:]) if has_test else []
    if has_test and not test:
        raise FolderDatasetError(f"{layout.root / TEST_DIR}: no readable images "
                                 f"({len(layout.test_files)} skipped as unreadable)")
    images = _stack([a for _, _, a in train + test])  # (N_train + N_test, C, H, W)
    height, width = images.shape[2:]
    info: dict[str, Any] = {"source": NAME, "root": str(layout.root.resolve()),
                            "channels": int(images.shape[1]),
                            "image_size": [int(height), int(width)],
                            "skipped": skipped}
    labels = torch.tensor([y for _, y, _ in train], dtype=torch.long)  # (N_train,)
    if has_test:
        order = training_order(len(test))  # mixed classes: a test set's first images vary
        test_images = torch.from_numpy(images[len(train):])[order]  # (N_test, C, H, W)
        test_labels = torch.tensor([y for _, y, _ in test], dtype=torch.long)[order]
        train_images = torch.from_numpy(images[:len(train)])  # (N_train, C, H, W)
        train_labels = labels
    else:
        train_index, test_index = held_out(labels, test_fraction, seed)
        test_index = test_index[training_order(len(test_index))]  # mixed classes
        info["test_split"] = {"seed": seed, "fraction": test_fraction,
                              "files": [layout.relative(train[i][0]) for i in test_index.tolist()]}
        all_images = torch.from_numpy(images)
        train_images, train_labels = all_images[train_index], labels[train_index]
        test_images, test_labels = all_images[test_index], labels[test_index]
    # Folders list their images class by class; both splits are held in a seeded shuffled
    # order, as in MNIST's files, so that the first N images (--subset, the figures' first
    # test images) mix classes.
    order = training_order(len(train_labels))  # (N,)
    train_images, train_labels = train_images[order], train_labels[order]
    return (ImageDataset(train_images, train_labels, layout.classes, NAME, copy.deepcopy(info)),
            ImageDataset(test_images, test_labels, layout.classes, NAME, copy.deepcopy(info)))


def _check_options(image_size: Any, channels: Any, test_fraction: float) -> None:
    """Raise ValueError for an option load_folder_dataset cannot use."""
    if image_size is not None and (isinstance(image_size, bool) or not isinstance(image_size, int)
                                   or image_size < 1):
        raise ValueError(f"image_size must be a positive integer or None, got {image_size!r}")
    if channels is not None and channels not in CHANNEL_CHOICES:
        raise ValueError(f"channels must be one of {CHANNEL_CHOICES} or None, got {channels!r}")
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction!r}")


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
    _check_options(image_size, channels, test_fraction)
    layout = scan_folder(root)
    options = {"image_size": image_size, "channels": channels, "skip_bad": skip_bad,
               "seed": seed, "test_fraction": test_fraction}
    base = (Path(cache_dir).expanduser() if cache_dir is not None
            else default_cache_dir() / CACHE_SUBDIR)
    path = cache_path(base, layout.root, options, layout.stats())
    cached = load_cached(path, layout.classes, NAME)
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
