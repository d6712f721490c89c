"""What the data decides about a model (input normalisation, CapsNet's Conv1 stride, whether
own images are made as MNIST's digits were) and a dataset as a trained model sees it: the
test split at the model's channels and size, centre-cropped for a model trained on crops;
the classes' names as a model's text gives them."""
from __future__ import annotations

import os
from collections.abc import Sequence

from PIL import Image, UnidentifiedImageError

from capsnet.config import INPUT_NORMS, conv_output_size
from capsnet.data.datasets import FOLDER, load_dataset, load_split
from capsnet.data.folder import FolderDatasetError, scan_folder
from capsnet.data.image_dataset import GREY_NDIM, ImageDataset
from capsnet.data.transforms import center_crop, place_on_canvas

# Datasets of handwritten digits, whose own images are made like MNIST's (not Fashion-MNIST).
DIGIT_DATASETS = ("mnist",)
# Conv1's stride for other data grows until the primary grid has at most this many times
# the paper's 6 x 6 cells (32x32 keeps stride 1, 48x48 takes 2, 64x64 takes 3).
MAX_PRIMARY_CELLS_FACTOR = 2
PAPER_IMAGE_SIZE = 28  # MNIST's side, where the paper's CapsNet has its 6 x 6 primary grid


def input_norm_for(dataset: str, requested: str = "auto") -> str:
    """The paper's raw pixels for digit datasets, per-image standardisation otherwise;
    ``requested`` other than 'auto' wins."""
    if requested != "auto":
        if requested not in INPUT_NORMS:
            raise ValueError(f"unknown input normalisation {requested!r}; choose from auto, "
                             f"{', '.join(INPUT_NORMS)}")
        return requested
    return "none" if dataset in DIGIT_DATASETS else "image"


def conv1_stride_for(config, dataset: str, requested: str | int = "auto") -> int:
    """Conv1's stride: the paper's for digit datasets, else the smallest whose primary grid
    has at most MAX_PRIMARY_CELLS_FACTOR times the paper's cells; ``requested`` wins."""
    if requested != "auto":
        stride = int(requested)
        if stride < 1:
            raise ValueError(f"conv1 stride must be at least 1, not {requested!r}")
        return stride
    if dataset in DIGIT_DATASETS:
        return config.conv1_stride

    def primary_grid(conv1_stride: int, image_size: int) -> int:
        """Side of the primary grid at ``conv1_stride`` on ``image_size`` images; < 1: none."""
        conv1 = conv_output_size(image_size, config.conv1_kernel, conv1_stride)
        return conv_output_size(conv1, config.primary_kernel, config.primary_stride)

    most = MAX_PRIMARY_CELLS_FACTOR * primary_grid(1, PAPER_IMAGE_SIZE) ** 2
    stride = config.conv1_stride
    while (primary_grid(stride, config.image_size) ** 2 > most
           and primary_grid(stride + 1, config.image_size) >= 1):
        stride += 1
    return stride


# Own data this large (a side or a class count) gets the capsule head, whose class capsules
# share their matrices across positions, instead of CapsNet with a strided Conv1.
LARGE_IMAGE_SIZE = 64
MANY_CLASSES = 100
AUTO_MODEL = "auto"
# A small training set still gets this many optimiser steps per epoch: the batch halves
# (down to MIN_BATCH_SIZE) until it does (450 images at batch 128 are 4 steps an epoch).
MIN_STEPS_PER_EPOCH = 25
MIN_BATCH_SIZE = 8


def model_for_data(image_size: int, num_classes: int) -> str:
    """The model own data of this size gets: 'capsnet' (the paper's, Conv1 strided by
    :func:`conv1_stride_for`) below LARGE_IMAGE_SIZE px and MANY_CLASSES classes, else
    'capshead' (capsules on a residual stem, parameters independent of the image's area)."""
    if image_size >= LARGE_IMAGE_SIZE or num_classes >= MANY_CLASSES:
        return "capshead"
    return "capsnet"


def folder_shape(root: str | os.PathLike, image_size: int | None = None) -> tuple[int, int]:
    """(image side, classes) of an image folder from its listing and one image's header,
    nothing decoded: ``image_size`` if given, else the first readable training image's
    height (a folder without ``image_size`` has one size, or fails to load)."""
    layout = scan_folder(root)
    if image_size is not None:
        return image_size, len(layout.classes)
    for path, _ in layout.train:
        try:
            with Image.open(path) as image:  # the header only
                return image.height, len(layout.classes)
        except (OSError, UnidentifiedImageError):
            continue  # unreadable: the loader reports or skips it
    raise FolderDatasetError(f"{layout.root}: no readable training image")


def resolve_model(name: str, image_size: int, num_classes: int) -> str:
    """``name``, or for 'auto' the model :func:`model_for_data` picks."""
    return model_for_data(image_size, num_classes) if name == AUTO_MODEL else name


def batch_size_for(num_images: int, requested: int) -> int:
    """``requested``, halved (not below MIN_BATCH_SIZE) until an epoch of ``num_images`` has
    MIN_STEPS_PER_EPOCH steps: a small folder still gets enough optimiser steps."""
    batch = requested
    while batch > MIN_BATCH_SIZE and num_images / batch < MIN_STEPS_PER_EPOCH:
        batch //= 2
    return max(batch, min(MIN_BATCH_SIZE, requested))


def is_digit_model(config) -> bool:
    """True for a grey model trained on handwritten digits (own images made MNIST-like)."""
    return config.dataset in DIGIT_DATASETS and config.in_channels == 1


def fit_to_model(data: ImageDataset, config) -> ImageDataset:
    """``data`` at the channels and input size of the model with ``config``."""
    data = data.with_channels(config.in_channels)
    side = config.uncropped_size or config.image_size
    height, _ = data.image_size
    if is_digit_model(config) and height < side:
        grey = data.images if data.images.dim() == GREY_NDIM else data.images[:, 0]  # (N, H, W)
        data = data.replaced(place_on_canvas(grey, side))  # (N, side, side)
    else:
        data = data.resized(side)
    if config.image_size < side:
        data = data.replaced(center_crop(data.images, config.image_size))
    return data


def load_test_set(config, dataset: str | None = None,
                  data_dir: str | os.PathLike | None = None, download: bool = True,
                  skip_bad: bool = False, progress: bool = True) -> ImageDataset:
    """The test split of ``dataset`` (default: the model's own) as the model sees it;
    ValueError when its classes are not the model's (by name when recorded)."""
    name = (dataset or config.dataset).lower()
    side = config.uncropped_size or config.image_size
    if name == FOLDER:
        _, test = load_dataset(FOLDER, data_dir, image_size=side, channels=config.in_channels,
                               skip_bad=skip_bad, progress=progress)
    else:
        test = load_split(name, "test", data_dir, download)
    if test.num_classes != config.num_classes:
        raise ValueError(f"the {name} test set has {test.num_classes} classes but the model "
                         f"has {config.num_classes} (trained on {config.dataset}); pass its "
                         f"own data with --dataset and --data-dir")
    if config.class_names and tuple(test.classes) != tuple(config.class_names):
        raise ValueError(f"the {name} test set's classes ({', '.join(test.classes)}) are not "
                         f"the model's ({', '.join(class_names(config))})")
    return fit_to_model(test, config)


def class_names(config) -> list[str]:
    """The classes' names in index order: the config's, else "0", "1", ..."""
    return list(config.class_names) or [str(i) for i in range(config.num_classes)]


def label_of(config, index: int) -> str:
    """How class ``index`` is named in text: "7" for digits named by their index, else the
    name with the index, "Sneaker (7)"."""
    return indexed_name(class_names(config), index)


def indexed_name(names: Sequence[str], index: int) -> str:
    """names[index], followed by " (index)" unless the name is the index itself."""
    name = names[index]
    return name if name == str(index) else f"{name} ({index})"


def class_index(config, text: str) -> int:
    """A class named on the command line, by index ("7") or by name ("Sneaker"), -> its
    index; ValueError naming the classes when there is no such class."""
    names = class_names(config)
    if text in names:
        return names.index(text)
    if text.lstrip("-").isdigit() and 0 <= int(text) < len(names):
        return int(text)
    named = any(name != str(j) for j, name in enumerate(names))
    listed = f" ({', '.join(f'{j}={n}' for j, n in enumerate(names))})" if named else ""
    raise ValueError(f"no class {text!r}: the model's classes are 0..{len(names) - 1}{listed}")
