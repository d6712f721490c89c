"""One epoch of training and one pass of evaluation over tensors already on the device."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from capsnet.data.augment_efficient import efficient_augment
from capsnet.data.image_dataset import to_model_input
from capsnet.data.transforms import random_crop, random_shift
from capsnet.losses import model_loss
from capsnet.models import class_scores


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


@dataclass
class StepOptions:
    """How each training step is run."""

    batch_size: int = 128
    max_shift: int = 2  # the paper's augmentation: shifts of up to 2 pixels
    reconstruction_weight: float = 0.0005
    check_every: int = 20  # steps between loss read-backs (finite check, progress)
    crop: int | None = None  # random crops of this size (the paper's CIFAR-10 24x24), not shifts
    grad_scaler: Any = None  # torch.amp.GradScaler when the model trains in fp16, else None
    # sums a tensor over the DDP ranks (distributed.summer), so that every rank sees the
    # same loss at a read-back and stops alike on a non-finite one; None in one process
    sum_over_ranks: Callable[[torch.Tensor], torch.Tensor] | None = None
    # the fraction of the whole run done at this epoch's start and end: losses that change
    # over the run (the spread loss's margin) take each step's; (1, 1): the final loss
    run_span: tuple[float, float] = (1.0, 1.0)
    augment: str = "shift"  # 'shift' (max_shift, or crop) or 'efficient' (Efficient-CapsNet's)

    def __post_init__(self) -> None:
        if self.augment == "efficient" and self.crop is not None:
            raise ValueError("random crops take the place of the 'shift' augmentation; they "
                             "do not combine with the 'efficient' one")


# (indices of the batch (B,), the run's fraction done at this step) -> the batch's loss,
# a float32 scalar with its graph, and how many of its images the model got right, a scalar
BatchLoss = Callable[[torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]


def train_one_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
                    labels: torch.Tensor, order: torch.Tensor, options: StepOptions,
                    generator: torch.Generator | None = None,
                    on_progress: Callable[[int, float, float], None] | None = None,
                    batch_loss: BatchLoss | None = None) -> dict:
    """Train over ``images[order]`` (images (N, H, W) uint8, labels (N,), order (M,)), each
    batch's loss from ``batch_loss`` (default: :func:`classification_loss`'s).
    Returns {'loss', 'accuracy', 'steps'}; ``on_progress(done, loss, accuracy)`` and the
    NonFiniteLossError check run at each read-back, every ``check_every`` steps."""
    model.train()
    batch_loss = batch_loss or classification_loss(model, images, labels, options, generator)
    device = images.device
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    seen = 0
    batches = order.split(options.batch_size)
    start, end = options.run_span
    for step, idx in enumerate(batches, start=1):
        loss, right = batch_loss(idx, start + (end - start) * (step - 1) / len(batches))
        optimizer.zero_grad(set_to_none=True)
        backward_and_step(loss, optimizer, options.grad_scaler)
        loss_sum += loss.detach() * idx.numel()
        correct += right
        seen += idx.numel()
        if step % options.check_every == 0 or step == len(batches):
            mean_loss = checked_mean_loss(loss_sum, seen, options.sum_over_ranks,
                                          f"within steps {max(1, step - options.check_every + 1)}"
                                          f"-{step} of the epoch")
            if on_progress is not None:
                on_progress(seen, mean_loss, correct.item() / seen)
    return {"loss": loss_sum.item() / max(seen, 1), "accuracy": correct.item() / max(seen, 1),
            "steps": len(batches)}


def classification_loss(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                        options: StepOptions, generator: torch.Generator | None = None
                        ) -> BatchLoss:
    """The classifier's batch: augmented images, the model's loss (margin, spread or cross
    entropy, plus the weighted reconstruction), and its top-1 hits."""
    def batch_loss(idx: torch.Tensor, run_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
        x = augment(to_model_input(images[idx]), options, generator)  # (B, C, H, W)
        y = labels[idx]  # (B,)
        out = model(x, y)  # in the model's compute precision
        loss = model_loss(out, x, y, options.reconstruction_weight,
                          run_fraction=run_fraction)  # float32
        return loss, (class_scores(out).argmax(-1) == y).sum()
    return batch_loss


def backward_and_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer,
                      grad_scaler=None) -> None:
    """loss.backward() and an optimiser step, through the fp16 ``grad_scaler`` if any."""
    if grad_scaler is None:
        loss.backward()
        optimizer.step()
        return
    grad_scaler.scale(loss).backward()
    grad_scaler.step(optimizer)
    grad_scaler.update()


def checked_mean_loss(loss_sum: torch.Tensor, seen: int,
                      sum_over_ranks: Callable[[torch.Tensor], torch.Tensor] | None,
                      where: str) -> float:
    """The mean loss so far (over all ranks); NonFiniteLossError naming ``where``."""
    if sum_over_ranks is None:
        mean_loss = loss_sum.item() / max(seen, 1)
    else:
        totals = sum_over_ranks(torch.stack([loss_sum.double(), torch.tensor(
            float(seen), dtype=torch.float64, device=loss_sum.device)]))  # (2,)
        mean_loss = (totals[0] / totals[1].clamp_min(1)).item()
    if not math.isfinite(mean_loss):
        raise NonFiniteLossError(f"training loss became {mean_loss} {where}")
    return mean_loss


def augment(x: torch.Tensor, options: StepOptions,
            generator: torch.Generator | None = None) -> torch.Tensor:
    """The training augmentation of a float batch (B, C, H, W): Efficient-CapsNet's, a random
    ``crop``, or random shifts of up to ``max_shift`` pixels."""
    if options.augment == "efficient":
        return efficient_augment(x, generator)  # (B, C, H, W)
    if options.crop is not None:
        return random_crop(x, options.crop, generator)  # (B, C, crop, crop)
    return random_shift(x, options.max_shift, generator)  # (B, C, H, W)


@dataclass
class EvalResult:
    accuracy: float
    loss: float
    confusion: torch.Tensor  # (J, J) int64, rows: true class, columns: predicted

    @property
    def error(self) -> float:
        return 1.0 - self.accuracy

    @property
    def per_class_accuracy(self) -> list[float]:
        totals = self.confusion.sum(dim=1).clamp_min(1)
        return (self.confusion.diag().double() / totals).tolist()

    def as_dict(self) -> dict:
        return {"accuracy": self.accuracy, "error": self.error, "loss": self.loss,
                "per_class_accuracy": self.per_class_accuracy,
                "confusion": self.confusion.tolist()}


@torch.no_grad()
def predict_scores(model: nn.Module, images: torch.Tensor, batch_size: int = 500) -> torch.Tensor:
    """Class scores (N, J) float32 for uint8 images (N, H, W) on the model's device."""
    model.eval()
    scores = []
    for chunk in images.split(batch_size):
        scores.append(class_scores(model(to_model_input(chunk))).float())
    return torch.cat(scores)


@torch.no_grad()
def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
             batch_size: int = 500, reconstruction_weight: float = 0.0005) -> EvalResult:
    """Accuracy, mean loss and confusion matrix on uint8 images (N, H, W), labels (N,)."""
    model.eval()
    device = images.device
    loss_sum = torch.zeros((), device=device)
    predictions = []
    for x_u8, y in zip(images.split(batch_size), labels.split(batch_size), strict=False):
        x = to_model_input(x_u8)
        out = model(x)
        loss_sum += model_loss(out, x, y, reconstruction_weight).float() * y.numel()
        predictions.append(class_scores(out).argmax(-1))
    predicted = torch.cat(predictions)
    num_classes = class_scores(out).shape[-1]
    confusion = torch.bincount(labels * num_classes + predicted,
                               minlength=num_classes**2).view(num_classes, num_classes).cpu()
    accuracy = (predicted == labels).float().mean().item()
    return EvalResult(accuracy, loss_sum.item() / labels.numel(), confusion)
