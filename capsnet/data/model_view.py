"""A dataset as a trained model sees it: the test split at the model's channels and size
(digits centred on a larger canvas, others resized), centre-cropped for a model trained on
crops. evaluate, reconstruct, manipulate, routing and robustness read it from here."""
from __future__ import annotations

import os

import torch

from capsnet.config import class_names
from capsnet.data.augment import center_crop
from capsnet.data.datasets import FOLDER, load_dataset, load_split
from capsnet.data.image_dataset import ImageDataset
from capsnet.data.policy import is_digit_model
from capsnet.data.transforms import place_on_canvas


def fit_to_model(data: ImageDataset, config) -> ImageDataset:
    """``data`` at the channels and input size of the model with ``config``."""
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
    """The test split of ``dataset`` (default: the model's own) as the model sees it;
    ValueError when its classes are not the model's."""
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
    """ValueError unless the test set has the model's classes (by name when recorded)."""
    if test.num_classes != config.num_classes:
        raise ValueError(f"the {name} test set has {test.num_classes} classes but the model "
                         f"has {config.num_classes} (trained on {config.dataset}); pass its "
                         f"own data with --dataset and --data-dir")
    if config.class_names and tuple(test.classes) != tuple(config.class_names):
        raise ValueError(f"the {name} test set's classes ({', '.join(test.classes)}) are not "
                         f"the model's ({', '.join(class_names(config))})")
