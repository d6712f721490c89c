"""A dataset as a trained model sees it: the test split at the model's channels and size.

`capsnet evaluate`, `reconstruct`, `manipulate`, `routing --index` and `robustness` all
take their test images from :func:`load_test_set`, so they see what the training run
tested on:

- the dataset is the model's own (``config.dataset``) unless another is named; an image
  folder is read again from its root (its test/ folder, or the same seeded split);
- the images get the model's channels (grey as RGB, or RGB as luma) and its size: a
  folder is decoded at that size, other datasets are resized (antialiased bilinear);
  digits for a digit model with a larger canvas (affNIST, MultiMNIST) are centred on it;
- a model trained on crops (``config.uncropped_size``) sees the centre crop, as in training.
"""
from __future__ import annotations

import os

import torch

from capsnet.classes import class_names
from capsnet.data.augment import center_crop
from capsnet.data.datasets import FOLDER, load_dataset, load_split
from capsnet.data.image_dataset import ImageDataset
from capsnet.data.policy import is_digit_model
from capsnet.data.transforms import place_on_canvas


def fit_to_model(data: ImageDataset, config) -> ImageDataset:
    """``data`` at the channels and input size of the model with ``config`` (see the
    module docstring); the same dataset when it already fits."""
    data = data.with_channels(config.in_channels)
    side = config.uncropped_size or config.image_size
    height, _ = data.image_size
    if is_digit_model(config) and height < side:
        grey = data.images if data.images.dim() == 3 else data.images[:, 0]  # (N, H, W)
        data = _with_images(data, place_on_canvas(grey, side))  # (N, side, side)
    else:
        data = data.resized(side)
    if config.image_size < side:
        data = _with_images(data, center_crop(data.images, config.image_size))
    return data


def _with_images(data: ImageDataset, images: torch.Tensor) -> ImageDataset:
    return ImageDataset(images.contiguous(), data.labels, data.classes, data.name,
                        dict(data.info))


def load_test_set(config, dataset: str | None = None,
                  data_dir: str | os.PathLike | None = None, download: bool = True,
                  skip_bad: bool = False, progress: bool = True) -> ImageDataset:
    """The test split of ``dataset`` (default: the model's own) as the model with
    ``config`` sees it. For a folder, ``data_dir`` is its root and ``skip_bad`` skips
    unreadable files. Raises ValueError when the dataset's classes are not the model's."""
    name = (dataset or config.dataset).lower()
    side = config.uncropped_size or config.image_size
    if name == FOLDER:
        _, test = load_dataset(FOLDER, data_dir, image_size=side, channels=config.in_channels,
                               skip_bad=skip_bad, progress=progress)
    else:
        test = load_split(name, "test", data_dir, download)
    _check_classes(test, config, name)
    return fit_to_model(test, config)


def _check_classes(test: ImageDataset, config, name: str) -> None:
    """Raise ValueError unless the test set has the model's classes (by name when the
    model records names)."""
    if test.num_classes != config.num_classes:
        raise ValueError(f"the {name} test set has {test.num_classes} classes but the model "
                         f"has {config.num_classes} (trained on {config.dataset}); pass its "
                         f"own data with --dataset and --data-dir")
    if config.class_names and tuple(test.classes) != tuple(config.class_names):
        raise ValueError(f"the {name} test set's classes ({', '.join(test.classes)}) are not "
                         f"the model's ({', '.join(class_names(config))})")
