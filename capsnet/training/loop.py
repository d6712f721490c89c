"""One epoch of training and one pass of evaluation over tensors already on the device.

An epoch, top to bottom (:func:`run_epoch`): for each batch of the epoch's order,
``make_batch`` draws the training batch (the augmentation), ``step`` trains on it (forward,
loss, backward, Adam, the moving average: :func:`train_step`, on the device, with no read
back to the host), the learning-rate schedule moves on; every ``check_every`` steps (and
after the first) the loss is read back once, for the progress bar and the non-finite check.
With a CUDA graph the same step is captured once and replayed (:func:`cuda_graphed`)."""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from capsnet.attacks.training import adversarial_batch
from capsnet.data.augment_efficient import efficient_augment
from capsnet.data.augment_shift import epoch_shifts, shift_by
from capsnet.data.image_dataset import to_model_input
from capsnet.data.transforms import random_crop, random_shift
from capsnet.losses import model_loss
from capsnet.models import class_scores

# Eager steps (on a side stream) before a step is captured: the optimiser's state and the
# libraries' workspaces exist by then (torch.cuda.graphs' advice).
GRAPH_WARMUP_STEPS = 3


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


# The paper's augmentation: random shifts of up to 2 pixels.
PAPER_MAX_SHIFT = 2
# Steps between loss read-backs (the non-finite check and the progress bar).
CHECK_EVERY = 20
# Images per batch of evaluation (validation, the test, predictions).
EVAL_BATCH = 500


@dataclass
class StepOptions:
    """How each step of :func:`train_one_epoch` runs (the batch, the augmentation of
    :func:`classification_batch`, the read-backs of :func:`run_epoch`), in one object."""

    batch_size: int = 128
    max_shift: int = PAPER_MAX_SHIFT
    reconstruction_weight: float = 0.0005
    check_every: int = CHECK_EVERY
    crop: int | None = None  # random crops of this size (the paper's CIFAR-10 24x24), not shifts
    grad_scaler: Any = None  # torch.amp.GradScaler when the model trains in fp16, else None
    # sums a tensor over the DDP ranks (distributed.summer); None in one process
    sum_over_ranks: Callable[[torch.Tensor], torch.Tensor] | None = None
    # the fraction of the whole run done at this epoch's start and end: losses that change
    # over the run (the spread loss's margin) take each step's; (1, 1): the final loss
    run_span: tuple[float, float] = (1.0, 1.0)
    augment: str = "shift"  # 'shift' (max_shift, or crop) or 'efficient' (Efficient-CapsNet's)
    # adversarial training (capsnet.attacks.training): 'fgsm-rs', 'pgd' or None, its eps, steps
    adversarial: str | None = None
    adversarial_eps: float = 0.0
    adversarial_steps: int = 10

    def __post_init__(self) -> None:
        check_augmentation(self.augment, self.crop)

    def augmentation(self) -> dict:
        """:func:`classification_batch`'s keywords."""
        return dict(augment=self.augment, max_shift=self.max_shift, crop=self.crop,
                    adversarial=self.adversarial, adversarial_eps=self.adversarial_eps,
                    adversarial_steps=self.adversarial_steps)

    def read_backs(self) -> dict:
        """:func:`run_epoch`'s keywords."""
        return dict(run_span=self.run_span, check_every=self.check_every,
                    sum_over_ranks=self.sum_over_ranks)


def check_augmentation(augment: str, crop: int | None) -> None:
    if augment == "efficient" and crop is not None:
        raise ValueError("random crops take the place of the 'shift' augmentation; they "
                         "do not combine with the 'efficient' one")


Batch = tuple[torch.Tensor, ...]  # the model's input first, then what the loss needs
# (indices of the batch (B,)) -> the training batch
MakeBatch = Callable[[torch.Tensor], Batch]
# (model, batch, the run's fraction done at this step) -> the batch's loss, a float32 scalar
# with its graph, and how many of its examples the model got right, a scalar
BatchLoss = Callable[[nn.Module, Batch, Any], tuple[torch.Tensor, torch.Tensor]]
# (batch, run fraction) -> (loss, right), both detached: one whole training step
Step = Callable[[Batch, Any], tuple[torch.Tensor, torch.Tensor]]


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch_loss: BatchLoss,
               batch: Batch, run_fraction: float | torch.Tensor, grad_scaler=None,
               ema=None) -> tuple[torch.Tensor, torch.Tensor]:
    """One training step on the device, nothing read back: forward and loss, backward,
    Adam (through the fp16 ``grad_scaler`` if any), the moving average ``ema`` if any.
    Returns the detached loss and the count of right answers."""
    loss, right = batch_loss(model, batch, run_fraction)
    optimizer.zero_grad(set_to_none=True)
    if grad_scaler is None:
        loss.backward()
        optimizer.step()
    else:  # fp16: the scaler skips a step whose gradients overflowed
        grad_scaler.scale(loss).backward()
        grad_scaler.step(optimizer)
        grad_scaler.update()
    if ema is not None:
        ema.update(model)
    return loss.detach(), right


def run_epoch(step: Step, order: torch.Tensor, make_batch: MakeBatch, batch_size: int,
              scheduler=None, on_progress: Callable[[int, float, float], None] | None = None, *,
              run_span: tuple[float, float] = (1.0, 1.0), check_every: int = CHECK_EVERY,
              sum_over_ranks: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict:
    """Train one epoch over the batches of ``order`` (M,), ``batch_size`` each; step n of N
    gets the run fraction ``start + (end - start) * (n - 1) / N`` of ``run_span``. Returns
    {'loss', 'accuracy', 'steps'}; ``on_progress(done, loss, accuracy)`` and the
    NonFiniteLossError check (the loss summed over the ranks by ``sum_over_ranks``) run at
    each read-back: the first step, then every ``check_every`` steps and the last."""
    device = order.device
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    seen = 0
    batches = order.split(batch_size)
    start, end = run_span
    for n, idx in enumerate(batches, start=1):
        batch = make_batch(idx)  # the augmented batch, on the device
        loss, right = step(batch, start + (end - start) * (n - 1) / len(batches))
        if scheduler is not None:
            scheduler.step()  # the next step's rate
        loss_sum += loss * idx.numel()
        correct += right
        seen += idx.numel()
        if n == 1 or n % check_every == 0 or n == len(batches):
            mean_loss = checked_mean_loss(loss_sum, seen, sum_over_ranks,
                                          f"within steps {max(1, n - check_every + 1)}"
                                          f"-{n} of the epoch")
            if on_progress is not None:
                on_progress(seen, mean_loss, correct.item() / seen)
    return {"loss": loss_sum.item() / max(seen, 1), "accuracy": correct.item() / max(seen, 1),
            "steps": len(batches)}


def train_one_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
                    labels: torch.Tensor, order: torch.Tensor, options: StepOptions,
                    generator: torch.Generator | None = None,
                    on_progress: Callable[[int, float, float], None] | None = None) -> dict:
    """One classification epoch over ``images[order]`` (images (N, H, W) uint8, labels (N,),
    order (M,)) with the options' augmentation: :func:`run_epoch` of :func:`train_step`."""
    model.train()
    step = functools.partial(train_step, model, optimizer,
                             functools.partial(classification_loss,
                                               reconstruction_weight=options.reconstruction_weight),
                             grad_scaler=options.grad_scaler)
    make_batch = classification_batch(model, images, labels, generator,
                                      **options.augmentation())
    return run_epoch(step, order, make_batch, options.batch_size, on_progress=on_progress,
                     **options.read_backs())


def classification_batch(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                         generator: torch.Generator | None = None, *, augment: str = "shift",
                         max_shift: int = PAPER_MAX_SHIFT, crop: int | None = None,
                         adversarial: str | None = None, adversarial_eps: float = 0.0,
                         adversarial_steps: int = 10) -> MakeBatch:
    """The classifier's training batch of indices ``idx``: images with the augmentation
    (:func:`augment_batch`), or the ``model``'s own ``adversarial`` images of them
    (capsnet.attacks.training: 'fgsm-rs' or 'pgd', in the L-inf ``adversarial_eps`` ball),
    and their labels. The paper's shifts are drawn for the whole epoch here, at its start."""
    check_augmentation(augment, crop)
    shifts = (epoch_shifts(len(images), max_shift, generator, images.device)
              if augment == "shift" and crop is None else None)  # (N, 2)

    def make_batch(idx: torch.Tensor) -> Batch:
        x = to_model_input(images[idx])  # (B, C, H, W)
        x = (augment_batch(x, generator, augment=augment, max_shift=max_shift, crop=crop)
             if shifts is None else shift_by(x, shifts[idx], max_shift))
        y = labels[idx]  # (B,)
        if adversarial is not None:  # the model's own attacked images instead
            x = adversarial_batch(model, x, y, adversarial, adversarial_eps, adversarial_steps,
                                  generator=generator)
        return x, y
    return make_batch


def classification_loss(model: nn.Module, batch: Batch, run_fraction: float | torch.Tensor,
                        reconstruction_weight: float = 0.0005, margin_weight: float = 1.0
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's loss on a batch (x (B, C, H, W), y (B,)): margin (times
    ``margin_weight``), spread or cross entropy, plus the weighted reconstruction; and its
    top-1 hits."""
    x, y = batch
    out = model(x, y)  # in the model's compute precision
    loss = model_loss(out, x, y, reconstruction_weight, run_fraction=run_fraction,
                      margin_weight=margin_weight)  # float32
    return loss, (class_scores(out).argmax(-1) == y).sum()


def cuda_graphed(step: Step, warmup_steps: int = GRAPH_WARMUP_STEPS) -> Step:
    """``step`` captured once as a CUDA graph and replayed: its batches are copied into
    static buffers and the run fraction filled into a device scalar, so nothing in the step
    waits on the host. The first ``warmup_steps`` steps run eagerly on a side stream (they
    make Adam's state and the libraries' workspaces); a batch of another shape than the
    captured one (an epoch's tail) runs eagerly too. Needs an optimiser made with
    ``capturable=True`` and a learning rate that is a device tensor (a scheduler then fills
    it), no fp16 gradient scaler and no DDP; the model must not read values back."""
    graph, static_batch, static_fraction, static_out = None, None, None, None
    eager_steps, side = 0, None

    def shapes(batch: Batch) -> list[torch.Size]:
        return [t.shape for t in batch]

    def graphed(batch: Batch, run_fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal graph, static_batch, static_fraction, static_out, eager_steps, side
        if graph is not None and shapes(batch) == shapes(static_batch):
            for static, given in zip(static_batch, batch, strict=True):
                static.copy_(given)
            static_fraction.fill_(run_fraction)
            graph.replay()
            return static_out
        if graph is None and eager_steps >= warmup_steps:
            static_batch = tuple(t.clone() for t in batch)
            static_fraction = torch.full((), run_fraction, device=batch[0].device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = step(static_batch, static_fraction)
            graph.replay()  # capturing ran nothing: this is the step
            return static_out
        eager_steps += 1
        side = side or torch.cuda.Stream(batch[0].device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = step(batch, run_fraction)
        torch.cuda.current_stream().wait_stream(side)
        return out

    return graphed


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


def augment_batch(x: torch.Tensor, generator: torch.Generator | None = None, *,
                  augment: str = "shift", max_shift: int = PAPER_MAX_SHIFT,
                  crop: int | None = None) -> torch.Tensor:
    """The training augmentation of a float batch (B, C, H, W): Efficient-CapsNet's
    (``augment`` 'efficient'), a random ``crop``, or random shifts of up to ``max_shift``."""
    if augment == "efficient":
        return efficient_augment(x, generator)  # (B, C, H, W)
    if crop is not None:
        return random_crop(x, crop, generator)  # (B, C, crop, crop)
    return random_shift(x, max_shift, generator)  # (B, C, H, W)


@dataclass
class EvalResult:
    accuracy: float
    loss: float
    confusion: torch.Tensor  # (J, J) int64, rows: true class, columns: predicted
    scores: torch.Tensor | None = field(default=None, repr=False)  # (N, J) float32

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
def predict_scores(model: nn.Module, images: torch.Tensor,
                   batch_size: int = EVAL_BATCH) -> torch.Tensor:
    """Class scores (N, J) float32 for uint8 images (N, H, W) on the model's device."""
    model.eval()
    scores = []
    for chunk in images.split(batch_size):
        scores.append(class_scores(model(to_model_input(chunk))).float())
    return torch.cat(scores)


@torch.no_grad()
def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
             batch_size: int = EVAL_BATCH, reconstruction_weight: float = 0.0005) -> EvalResult:
    """Accuracy, mean loss, confusion matrix and class scores (those of
    :func:`predict_scores`) on uint8 images (N, H, W), labels (N,)."""
    model.eval()
    device = images.device
    loss_sum = torch.zeros((), device=device)
    scores = []
    for x_u8, y in zip(images.split(batch_size), labels.split(batch_size), strict=False):
        x = to_model_input(x_u8)
        out = model(x)
        loss_sum += model_loss(out, x, y, reconstruction_weight).float() * y.numel()
        scores.append(class_scores(out).float())  # (B, J)
    all_scores = torch.cat(scores)  # (N, J)
    predicted = all_scores.argmax(-1)
    num_classes = all_scores.shape[-1]
    confusion = torch.bincount(labels * num_classes + predicted,
                               minlength=num_classes**2).view(num_classes, num_classes).cpu()
    accuracy = (predicted == labels).float().mean().item()
    return EvalResult(accuracy, loss_sum.item() / labels.numel(), confusion, all_scores)
