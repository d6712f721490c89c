"""The paper's recipe: classify a dataset's images (MNIST by default), select the epoch by
validation accuracy and test once. :func:`fit` runs it through the one epoch driver."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from capsnet.data.datasets import ImageDataset, load_dataset
from capsnet.data.splits import epoch_order, epoch_seed, stratified_split
from capsnet.training import distributed
from capsnet.training.distributed import World
from capsnet.training.loop import StepOptions, evaluate, train_one_epoch
from capsnet.training.runner import Log, Progress, Task, run_task
from capsnet.training.settings import TrainSettings


@dataclass
class RunData:
    """The dataset on the training device, with the index sets of the run's split."""

    train: ImageDataset  # the full training set (N, H, W) or (N, C, H, W) uint8
    test: ImageDataset
    train_idx: torch.Tensor  # (M,) indices used for training
    val_idx: torch.Tensor  # (V,) held-out validation indices, possibly empty


def prepare_data(settings: TrainSettings, device: torch.device) -> RunData:
    """Load the dataset, carve the validation split, apply --subset, move to ``device``."""
    train, test = load_dataset(settings.dataset, settings.data_dir, settings.download)
    train_idx, val_idx = stratified_split(train.labels, settings.val_size, settings.seed)
    if settings.subset is not None:
        train_idx = train_idx[: settings.subset]
    return RunData(train.to(device), test.to(device), train_idx.to(device), val_idx.to(device))


class ClassifyTask(Task):
    """Images of a dataset with one label each; the paper's random shifts; validation on
    the held-out split; the test set evaluated once for the final and selected models."""

    name = "classify"

    def prepare(self, device: torch.device) -> None:
        self.data = prepare_data(self.settings, device)
        self.epoch_size = len(self.data.train_idx)

    def model_overrides(self) -> dict:
        return {"image_size": self.data.train.images.shape[-1],
                "num_classes": len(self.data.train.classes)}

    def describe(self, world: World) -> str:
        d = self.data
        return (f"{self.settings.model} on {self.settings.dataset}: {len(d.train_idx)} training, "
                f"{len(d.val_idx)} validation, {len(d.test.labels)} test images; device "
                f"{world.device}" + (f" x {world.size} processes" if world.distributed else ""))

    def train_epoch(self, model: nn.Module, optimizer, epoch: int, world: World,
                    on_progress: Progress) -> dict:
        s, device = self.settings, world.device
        order = self.data.train_idx[epoch_order(len(self.data.train_idx), s.seed, epoch, device)]
        order = distributed.shard_order(order, world.rank, world.size)  # this rank's share
        generator = torch.Generator(device=device).manual_seed(
            epoch_seed(s.seed, epoch) + 1 + world.rank)
        options = StepOptions(distributed.per_rank_batch(s.batch_size, world), s.max_shift,
                              s.reconstruction_weight)
        result = train_one_epoch(model, optimizer, self.data.train.images, self.data.train.labels,
                                 order, options, generator, on_progress)
        return {"train_loss": result["loss"], "train_accuracy": result["accuracy"],
                "images": len(order)}

    def validate(self, model: nn.Module, world: World) -> dict:
        d, row = self.data, {}
        kwargs = dict(world=world, num_classes=len(d.train.classes),
                      reconstruction_weight=self.settings.reconstruction_weight)
        if len(d.val_idx):
            val = distributed.evaluate_sharded(model, d.train.images[d.val_idx],
                                               d.train.labels[d.val_idx], **kwargs)
            row.update(val_loss=val.loss, val_accuracy=val.accuracy)
        if self.settings.monitor_test:
            test = distributed.evaluate_sharded(model, d.test.images, d.test.labels, **kwargs)
            row.update(test_accuracy_monitoring=test.accuracy)
        return row

    def final_report(self, final: nn.Module, best: nn.Module | None, state: dict,
                     log: Log) -> dict:
        kwargs = dict(reconstruction_weight=self.settings.reconstruction_weight)
        test = self.data.test
        final_result = evaluate(final, test.images, test.labels, **kwargs)
        results = {"final": final_result.as_dict()}
        if not len(self.data.val_idx):
            log(f"test accuracy {final_result.accuracy:.4f} (error "
                f"{100 * final_result.error:.2f}%) after the final epoch {state['epoch']} "
                f"(no validation split)")
            return results
        # the final epoch was the selected one: the same weights, no second evaluation
        best_result = final_result if best is None else evaluate(best, test.images, test.labels,
                                                                 **kwargs)
        log(f"test accuracy {best_result.accuracy:.4f} (error {100 * best_result.error:.2f}%) "
            f"for the validation-selected epoch {state['best_epoch']}; "
            f"{final_result.accuracy:.4f} for the final epoch {state['epoch']}")
        return {**results, "best": best_result.as_dict()}


def fit(settings: TrainSettings, resume: str | None = None, argv: list[str] | None = None,
        log: Callable[[str], None] = print) -> dict:
    """Train as ``settings`` say (the paper's recipe by default), writing everything to
    ``settings.out_dir``; returns the results (also written to results.json). Runs under
    torchrun as :func:`capsnet.training.runner.run_task` describes."""
    return run_task(ClassifyTask(settings), resume, argv, log)
