"""The paper's recipe: classify a dataset's images (or your own tensors), select the epoch by
validation accuracy, test once; :func:`fit` runs it through the one epoch driver."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from capsnet.atomic import atomic_write
from capsnet.data.datasets import FOLDER, ImageDataset, load_dataset
from capsnet.data.folder import DEFAULT_TEST_FRACTION, format_skipped_warning
from capsnet.data.image_dataset import (
    as_image_dataset,
    epoch_order,
    epoch_seed,
    held_out_split,
    stratified_split,
    to_model_input,
)
from capsnet.data.model_view import batch_size_for, conv1_stride_for, input_norm_for
from capsnet.data.transforms import center_crop
from capsnet.models import PRESET_CROPS, make_config
from capsnet.training import distributed
from capsnet.training.distributed import World
from capsnet.training.loop import (
    MakeBatch,
    classification_batch,
    evaluate,
    train_one_epoch,  # noqa: F401  (capsnet.training.fit.train_one_epoch, as before)
)
from capsnet.training.runner import Log, Task, run_task
from capsnet.training.settings import TrainSettings, validation_size

# Training images a model's data-dependent initialisation sees (the first of the split)
INITIALISATION_IMAGES = 256
# The tested model's test-set class scores beside results.json, for ensembles without weights
SCORES_FILE = "test_scores.npy"
LABELS_FILE = "test_labels.npy"


Datasets = tuple[ImageDataset, ImageDataset]  # (train, test)


def prepare_data(settings: TrainSettings, device: torch.device, log: Log = print,
                 own: Datasets | None = None
                 ) -> tuple[ImageDataset, ImageDataset, torch.Tensor, torch.Tensor]:
    """Load the dataset (or take your ``own``) at the requested size and channels, carve the
    validation split, apply --subset, move to ``device``: (train, test, train_idx (M,),
    val_idx (V,)), the whole training set (uncropped) with the indices of the run's training
    and held-out validation images in it, and the test set (centre-cropped to
    :func:`crop_for`'s size, if any)."""
    s = settings
    if own is None and s.dataset == FOLDER:
        # the test split carved out of a folder without test/ is the folder's own (seed 0),
        # whatever the run's seed: every run and `capsnet evaluate` test on the same images
        train, test = load_dataset(s.dataset, s.data_dir, s.download, image_size=s.image_size,
                                   channels=s.channels, skip_bad=s.skip_bad_images,
                                   progress=s.progress)
        warning = format_skipped_warning(train.info)
        if warning:
            log(warning)
    else:
        train, test = own or load_dataset(s.dataset, s.data_dir, s.download)
        if s.image_size is not None:
            train, test = train.resized(s.image_size), test.resized(s.image_size)
        if s.channels is not None:
            train, test = train.with_channels(s.channels), test.with_channels(s.channels)
    height, width = train.image_size
    if height != width:
        raise ValueError(f"the {s.dataset} images are {height}x{width}; the model takes square "
                         f"images: pass --image-size N (image_size=N) to resize them")
    val_size = validation_size(s.val_size, len(train.labels))
    train_idx, val_idx = stratified_split(train.labels, val_size, s.seed)
    if s.subset is not None:
        train_idx = train_idx[: s.subset]
    crop = crop_for(s)
    test = test.to(device)
    if crop is not None:
        test = test.replaced(center_crop(test.images, crop))
    return train.to(device), test, train_idx.to(device), val_idx.to(device)


def crop_for(settings: TrainSettings) -> int | None:
    """The side of the random training crops (and the centre crop evaluated), or None."""
    return settings.crop or PRESET_CROPS.get(settings.preset)


def protocol_data(settings: TrainSettings, device: torch.device,
                  protocol: str) -> tuple[ImageDataset, ImageDataset, ImageDataset]:
    """The data of a protocol that validates on held-out digits: (training, validation,
    test) images; ValueError without a validation split."""
    if settings.val_size is not None and settings.val_size < 1:
        raise ValueError(f"{protocol} training needs held-out validation digits (val_size > 0)")
    train, test, train_idx, val_idx = prepare_data(settings, device)
    return train.subset(train_idx), train.subset(val_idx), test


def data_overrides(settings: TrainSettings, train: ImageDataset, image_size: int,
                   crop: int | None = None) -> dict:
    """What the data decides in the model's config: size (``crop`` if given, else
    ``image_size``), channels, classes, dataset name, uncropped size and, for CapsNet, input
    norm and Conv1 stride."""
    # The baseline CNN sees raw pixels unless --input-norm asks (auto is the CapsNet's rule).
    norm = "none" if settings.model == "cnn" and settings.input_norm == "auto" else None
    overrides = {"input_norm": norm or input_norm_for(settings.dataset, settings.input_norm),
                 "image_size": crop or image_size, "in_channels": train.channels,
                 "num_classes": len(train.classes), "class_names": tuple(train.classes),
                 "dataset": settings.dataset,
                 "uncropped_size": train.image_size[0] if crop else None}
    if settings.model == "capsnet":
        paper_strides = make_config("capsnet", settings.preset, **overrides)
        overrides["conv1_stride"] = conv1_stride_for(paper_strides, settings.dataset,
                                                     settings.conv1_stride)
    return overrides


class ClassifyTask(Task):
    """One label per image; the settings' augmentation; validation on the held-out split;
    the final and selected models tested once, the selected one's test scores saved."""

    name = "classify"

    def __init__(self, settings: TrainSettings, own: Datasets | None = None):
        super().__init__(settings)
        self.own = own  # your (train, test) data instead of settings.dataset

    def prepare(self, device: torch.device) -> None:
        # the whole training set (train_idx and val_idx index it) and the test set
        self.train, self.test, self.train_idx, self.val_idx = prepare_data(
            self.settings, device, own=self.own)
        self.crop = crop_for(self.settings)  # training crops; train is uncropped, test cropped
        self.epoch_size = len(self.train_idx)

    def initialisation_images(self, count: int = INITIALISATION_IMAGES) -> torch.Tensor:
        """The first ``count`` training images, float (B, C, H, W), unaugmented."""
        return to_model_input(self.cropped(self.train.images[self.train_idx[:count]]))

    def validation(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Held-out images (V, ...) as the model sees them (centre-cropped) and labels (V,)."""
        return self.cropped(self.train.images[self.val_idx]), self.train.labels[self.val_idx]

    def cropped(self, images: torch.Tensor) -> torch.Tensor:
        return images if self.crop is None else center_crop(images, self.crop)

    def model_overrides(self) -> dict:
        return data_overrides(self.settings, self.train, self.train.image_size[0], self.crop)

    def describe(self, world: World) -> str:
        s, training = self.settings, len(self.train_idx)
        line = (f"{s.model} on {s.dataset}: {training} training, "
                f"{len(self.val_idx)} validation, {len(self.test)} test images; device "
                f"{world.device}" + (f" x {world.size} processes" if world.distributed else ""))
        enough = batch_size_for(training, s.batch_size)
        if enough < s.batch_size:  # a small folder: too few optimiser steps to learn
            line += (f"\nwarning: {-(-training // s.batch_size)} optimiser steps an "
                     f"epoch at batch {s.batch_size}; --batch-size {enough} gives "
                     f"{-(-training // enough)}")
        return line

    def epoch_batches(self, model: nn.Module, epoch: int, world: World
                      ) -> tuple[torch.Tensor, MakeBatch]:
        s, device = self.settings, world.device
        order = self.train_idx[epoch_order(len(self.train_idx), s.seed, epoch, device)]
        order = distributed.shard_order(order, world.rank, world.size)  # this rank's share
        generator = torch.Generator(device=device).manual_seed(
            epoch_seed(s.seed, epoch) + 1 + world.rank)
        return order, classification_batch(
            model, self.train.images, self.train.labels, generator,
            augment=s.augment, max_shift=s.max_shift, crop=self.crop,
            adversarial=s.adversarial, adversarial_eps=s.adversarial_eps or 0.0,
            adversarial_steps=s.adversarial_steps)

    def validate(self, model: nn.Module, world: World) -> dict:
        row = {}
        kwargs = dict(world=world, num_classes=len(self.train.classes),
                      reconstruction_weight=self.settings.reconstruction_weight)
        if len(self.val_idx):
            val = distributed.evaluate_sharded(model, *self.validation(), **kwargs)
            row.update(val_loss=val.loss, val_accuracy=val.accuracy)
        if self.settings.monitor_test:
            test = distributed.evaluate_sharded(model, self.test.images, self.test.labels,
                                                **kwargs)
            row.update(test_accuracy_monitoring=test.accuracy)
        return row

    def final_report(self, final: nn.Module, best: nn.Module | None, state: dict,
                     log: Log) -> dict:
        kwargs = dict(reconstruction_weight=self.settings.reconstruction_weight)
        test = self.test
        final_result = evaluate(final, test.images, test.labels, **kwargs)
        # the final epoch was the selected one: the same weights, no second evaluation
        selected = final_result if best is None else evaluate(best, test.images, test.labels,
                                                              **kwargs)
        # the selected model's test scores (N, J), for ensembles without weights
        save_test_scores(self.settings.out_dir, selected.scores, test.labels)
        results = {"final": final_result.as_dict()}
        if not len(self.val_idx):
            log(f"test accuracy {final_result.accuracy:.4f} (error "
                f"{100 * final_result.error:.2f}%) after the final epoch {state['epoch']} "
                f"(no validation split)")
            return results
        log(f"test accuracy {selected.accuracy:.4f} (error {100 * selected.error:.2f}%) "
            f"for the validation-selected epoch {state['best_epoch']}; "
            f"{final_result.accuracy:.4f} for the final epoch {state['epoch']}")
        return {**results, "best": selected.as_dict()}


def own_datasets(data: Any, test_data: Any = None) -> Datasets:
    """(train, test) of your data; without ``test_data`` a stratified
    DEFAULT_TEST_FRACTION is held out (seed 0)."""
    train = as_image_dataset(data)
    if test_data is None:
        return held_out_split(train, DEFAULT_TEST_FRACTION)
    test = as_image_dataset(test_data, train.name, train.classes)
    if test.num_classes != train.num_classes:
        raise ValueError(f"the test data has {test.num_classes} classes, the training data "
                         f"{train.num_classes}")
    return train, test


def fit(settings: TrainSettings | None = None, resume: str | None = None,
        argv: list[str] | None = None, log: Callable[[str], None] = print, *,
        data: Any = None, test_data: Any = None) -> dict:
    """Train as ``settings`` say into ``settings.out_dir``; returns results.json's content.

    The images are ``settings.dataset`` or your own ``data``: (images, labels) or a torch
    Dataset of (image, label); ``test_data`` likewise, else a tenth is held out. Resuming
    such a run needs the same ``data`` again."""
    settings = settings or TrainSettings()
    if not isinstance(settings, TrainSettings):
        raise TypeError(f"fit's first argument is a TrainSettings, got "
                        f"{type(settings).__name__}; pass your data as "
                        f"fit(settings, data=(images, labels))")
    own = None if data is None else own_datasets(data, test_data)
    if own is not None:
        settings = dataclasses.replace(settings, dataset=own[0].name)
    return run_task(ClassifyTask(settings, own), resume, argv, log)


def save_test_scores(run_dir: str | Path, scores: torch.Tensor, labels: torch.Tensor) -> None:
    """Write scores (N, J) as float32 and labels (N,) as int64 into ``run_dir``."""
    run_dir = Path(run_dir)
    for name, values in ((SCORES_FILE, scores.detach().float()),
                         (LABELS_FILE, labels.detach().long())):
        atomic_write(run_dir / name, lambda f, values=values: np.save(f, values.cpu().numpy()))
