"""The paper's affNIST protocol (Sabour et al. 2017, section 5.2): train on MNIST digits placed
at random on a 40x40 canvas, test on placed and on affine-transformed digits. The affine set
is made here from the MNIST test digits with affNIST's ranges, seeded (not the affNIST files)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch import nn

from capsnet.data.image_dataset import epoch_order, to_model_input
from capsnet.data.transforms import AffineRanges, affine_set, place_on_canvas
from capsnet.experiments import SEED_STRIDE, TEST_SEED
from capsnet.experiments.robustness import NamedModel
from capsnet.models import count_parameters
from capsnet.training import distributed
from capsnet.training.distributed import World
from capsnet.training.fit import INITIALISATION_IMAGES, data_overrides, protocol_data
from capsnet.training.loop import MakeBatch, classification_batch, evaluate
from capsnet.training.runner import Log, Task, run_task
from capsnet.training.settings import TrainSettings

CANVAS = 40  # affNIST's image size


def placed(images: torch.Tensor, canvas: int, seed: int) -> torch.Tensor:
    """``images`` (N, 28, 28) at seeded random places on a black canvas (N, canvas, canvas);
    positions drawn on the CPU, the same on every device."""
    return place_on_canvas(images, canvas, torch.Generator().manual_seed(seed))


def evaluation_sets(images: torch.Tensor, canvas: int, seed: int) -> dict[str, torch.Tensor]:
    """The protocol's test sets (N, canvas, canvas) uint8: 'mnist' (placed) and 'affine' (with
    affNIST's ranges)."""
    return {"mnist": placed(images, canvas, seed),
            "affine": affine_set(images, AffineRanges(), seed, out_size=canvas)}


def compare(models: Sequence[NamedModel], images: torch.Tensor, labels: torch.Tensor,
            seed: int = TEST_SEED, batch_size: int = 500) -> list[dict]:
    """A row per model: its accuracy on the placed MNIST test digits and on the affine set.
    Every model must take the same square input size (the canvas)."""
    sizes = {m.image_size for m in models}
    if len(sizes) != 1:
        raise ValueError(f"the models take different input sizes {sorted(sizes)}; the affNIST "
                         f"comparison needs one canvas")
    canvas = sizes.pop()
    if canvas <= images.shape[-1]:
        raise ValueError(f"the models take {canvas}x{canvas} images: train them on a larger "
                         f"canvas with `capsnet affnist train` (default {CANVAS})")
    sets = evaluation_sets(images, canvas, seed)
    rows = []
    for m in models:
        acc = {name: evaluate(m.model, x, labels, batch_size=batch_size).accuracy
               for name, x in sets.items()}
        rows.append({"model": m.label, "parameters": count_parameters(m.model), "canvas": canvas,
                     "images": len(labels), "mnist_accuracy": acc["mnist"],
                     "affine_accuracy": acc["affine"]})
    return rows


def format_comparison(rows: Sequence[dict]) -> str:
    """The rows of :func:`compare` as a plain-text table (accuracy in percent)."""
    width = max([len(r["model"]) for r in rows] + [len("model")])
    lines = [f"{'model':<{width}} {'parameters':>10} {'MNIST (placed)':>14} {'affine':>8}"]
    lines += [f"{r['model']:<{width}} {r['parameters']:>10,} {100 * r['mnist_accuracy']:>13.2f}% "
              f"{100 * r['affine_accuracy']:>7.2f}%" for r in rows]
    return "\n".join(lines)


class AffnistTask(Task):
    """Digits placed afresh every epoch, validation digits placed alike, the selected model
    tested on both test sets."""

    name = "affnist"

    def prepare(self, device: torch.device) -> None:
        s = self.settings
        self.canvas = s.canvas or CANVAS
        self.train, val, self.test = protocol_data(s, device, "affNIST")
        self.images, self.labels = self.train.images, self.train.labels
        self.val_images = placed(val.images, self.canvas, s.seed)
        self.val_labels = val.labels
        self.epoch_size = len(self.labels)

    def model_overrides(self) -> dict:
        return data_overrides(self.settings, self.train, image_size=self.canvas)

    def describe(self, world: World) -> str:
        return (f"affNIST protocol: {self.settings.model} on {len(self.images)} MNIST digits at "
                f"random places on a {self.canvas}x{self.canvas} canvas, "
                f"{len(self.val_labels)} validation digits; device {world.device}")

    def initialisation_images(self) -> torch.Tensor:
        """The first training digits, placed on the canvas as an epoch would place them."""
        digits = placed(self.images[:INITIALISATION_IMAGES], self.canvas, self.settings.seed)
        return to_model_input(digits)  # (B, 1, canvas, canvas)

    def epoch_batches(self, model: nn.Module, epoch: int, world: World
                      ) -> tuple[torch.Tensor, MakeBatch]:
        s = self.settings
        x = placed(self.images, self.canvas, s.seed * SEED_STRIDE + epoch)  # (M, 40, 40)
        order = epoch_order(len(self.labels), s.seed, epoch, world.device)
        order = distributed.shard_order(order, world.rank, world.size)
        return order, classification_batch(model, x, self.labels, max_shift=0)

    def validate(self, model: nn.Module, world: World) -> dict:
        val = distributed.evaluate_sharded(model, self.val_images, self.val_labels, world,
                                           len(self.train.classes),
                                           reconstruction_weight=self.settings.reconstruction_weight)
        return {"val_loss": val.loss, "val_accuracy": val.accuracy}

    def final_report(self, final: nn.Module, best: nn.Module | None, state: dict,
                     log: Log) -> dict:
        test, limit = self.test, self.settings.test_limit  # limit None: every test digit
        selected = NamedModel(self.settings.model, best if best is not None else final)
        row = compare([selected], test.images[:limit], test.labels[:limit])[0]
        log(f"test: {100 * row['mnist_accuracy']:.2f}% on placed MNIST, "
            f"{100 * row['affine_accuracy']:.2f}% on the affine set "
            f"(validation-selected epoch {state['best_epoch']})")
        return {"test": row, "test_seed": TEST_SEED}


def train_affnist(settings: TrainSettings, resume: str | None = None,
                  argv: list[str] | None = None, log: Callable[[str], None] = print) -> dict:
    """Train ``settings.model`` under the affNIST protocol; returns results.json's content."""
    settings = dataclasses.replace(settings, task="affnist", augment="shift", max_shift=0)
    return run_task(AffnistTask(settings), resume, argv, log)
