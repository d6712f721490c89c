"""Training and evaluating a CapsNet on MultiMNIST: a fresh pairing of the training digits
every epoch, validation pairs from held-out digits, the paper's top-2 test metric."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from capsnet.data.image_dataset import epoch_order, to_model_input
from capsnet.experiments import SEED_STRIDE, TEST_SEED
from capsnet.experiments.multimnist import (
    ClassIndex,
    DigitPairs,
    canvas_size,
    make_pairs,
    model_inputs,
    pair_loss,
    pair_set,
    pairs_correct,
    top_two,
)
from capsnet.inference import require_decoder
from capsnet.training import distributed
from capsnet.training.distributed import World
from capsnet.training.fit import data_overrides, protocol_data
from capsnet.training.loop import StepOptions, backward_and_step, checked_mean_loss
from capsnet.training.runner import Log, Progress, Task, run_task
from capsnet.training.settings import TrainSettings

TEST_PAIRS = 10_000


def train_pairs_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
                      labels: torch.Tensor, order: torch.Tensor, batch_size: int, max_shift: int,
                      reconstruction_weight: float, generator: torch.Generator | None = None,
                      options: StepOptions | None = None) -> dict:
    """One epoch over pairs whose first digits are ``images[order]`` (N, 28, 28), partners
    and shifts from ``generator``; ``options`` adds the fp16 scaler and the sum over ranks.
    Returns {'train_loss', 'train_accuracy'} (both digits right)."""
    options = options or StepOptions()
    model.train()
    device = images.device
    index = ClassIndex.of(labels)  # once per epoch: no host sync per step
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    for idx in order.split(batch_size):
        pairs = make_pairs(images, labels, idx, max_shift, generator, index)  # (B, S, S)
        x, digits = model_inputs(pairs)  # (B, 1, S, S), (B, 2, 1, S, S)
        loss, out = pair_loss(model, x, pairs.labels, digits, reconstruction_weight)
        optimizer.zero_grad(set_to_none=True)
        backward_and_step(loss, optimizer, options.grad_scaler)
        loss_sum += loss.detach() * idx.numel()
        correct += pairs_correct(out.lengths.detach(), pairs.labels).sum()
    checked_mean_loss(loss_sum, order.numel(), options.sum_over_ranks, "in a MultiMNIST epoch")
    return {"train_loss": loss_sum.item() / max(order.numel(), 1),
            "train_accuracy": correct.item() / max(order.numel(), 1)}


@torch.no_grad()
def evaluate_pairs(model: nn.Module, pairs: DigitPairs, batch_size: int = 500,
                   world: World | None = None) -> dict:
    """The paper's MultiMNIST metric (the two most active capsules are the pair's digits),
    each rank taking every world-th pair. Returns {'accuracy', 'error', 'pairs'}."""
    model.eval()
    world = world or World()
    device = pairs.images.device
    mine = pairs if not world.distributed else pairs.subset(
        torch.arange(world.rank, len(pairs), world.size, device=device))  # every world-th
    correct = torch.zeros((), device=device, dtype=torch.long)
    for start in range(0, len(mine), batch_size):
        batch = mine.subset(slice(start, start + batch_size))
        out = model(to_model_input(batch.images))  # lengths (B, J)
        correct += pairs_correct(out.lengths, batch.labels).sum()
    accuracy = distributed.all_reduce_sum(correct, world).item() / max(len(pairs), 1)
    return {"accuracy": accuracy, "error": 1.0 - accuracy, "pairs": len(pairs)}


@torch.no_grad()
def reconstruct_pairs(model: nn.Module, pairs: DigitPairs) -> tuple[torch.Tensor, ...]:
    """Each pair reconstructed from its two most active capsules: first, second (K, S, S)
    in [0, 1], and those capsules (K, 2)."""
    model.eval()
    require_decoder(model)
    out = model(to_model_input(pairs.images))  # poses (K, J, D)
    chosen = top_two(out.lengths)  # (K, 2)
    first = model.decoder(out.poses, chosen[:, 0])[:, 0]  # (K, S, S)
    second = model.decoder(out.poses, chosen[:, 1])[:, 0]  # (K, S, S)
    return first, second, chosen


class MultiMnistTask(Task):
    """Fresh pairs every epoch, validation pairs of held-out digits, the selected model
    tested on ``test_pairs`` pairs with the top-2 metric."""

    name = "multimnist"

    def prepare(self, device: torch.device) -> None:
        s = self.settings
        if s.model != "capsnet":
            raise ValueError("MultiMNIST training is for CapsNet (its two active capsules)")
        self.data, self.images, self.labels = protocol_data(s, device, "MultiMNIST")
        d = self.data
        self.val = pair_set(d.train.images[d.val_idx], d.train.labels[d.val_idx],
                            len(d.val_idx), s.seed, s.max_shift)
        self.epoch_size = len(self.labels)

    def model_overrides(self) -> dict:
        side = canvas_size(self.images.shape[-1], self.settings.max_shift)
        return data_overrides(self.settings, self.data, image_size=side)

    def describe(self, world: World) -> str:
        side = canvas_size(self.images.shape[-1], self.settings.max_shift)
        return (f"MultiMNIST: {len(self.images)} training digits paired afresh each epoch, "
                f"{len(self.val)} validation pairs, {side}x{side} images; device {world.device}")

    def train_epoch(self, model: nn.Module, optimizer, epoch: int, world: World,
                    on_progress: Progress) -> dict:
        s, device = self.settings, world.device
        order = epoch_order(len(self.images), s.seed, epoch, device)
        order = distributed.shard_order(order, world.rank, world.size)
        g = torch.Generator(device=device).manual_seed(s.seed * SEED_STRIDE + epoch + world.rank)
        options = StepOptions(grad_scaler=self.grad_scaler,
                              sum_over_ranks=distributed.summer(world))
        result = train_pairs_epoch(model, optimizer, self.images, self.labels, order,
                                   distributed.per_rank_batch(s.batch_size, world), s.max_shift,
                                   s.reconstruction_weight, g, options)
        return {**result, "images": len(order)}

    def validate(self, model: nn.Module, world: World) -> dict:
        """Validation pairs shared out to the ranks and their counts summed."""
        return {"val_accuracy": evaluate_pairs(model, self.val, world=world)["accuracy"]}

    def final_report(self, final: nn.Module, best: nn.Module | None, state: dict,
                     log: Log) -> dict:
        s, d = self.settings, self.data
        test = pair_set(d.test.images, d.test.labels, s.test_pairs or TEST_PAIRS, TEST_SEED,
                        s.max_shift)
        result = evaluate_pairs(best if best is not None else final, test)
        log(f"MultiMNIST test: {100 * result['accuracy']:.2f}% of {len(test)} pairs with both "
            f"digits right (error {100 * result['error']:.2f}%), validation-selected epoch "
            f"{state['best_epoch']}")
        return {"test": result, "test_seed": TEST_SEED}


def train_multimnist(settings: TrainSettings, resume: str | None = None,
                     argv: list[str] | None = None,
                     log: Callable[[str], None] = print) -> dict:
    """Train a CapsNet on MultiMNIST as ``settings`` say; returns (and writes) results.json."""
    return run_task(MultiMnistTask(dataclasses.replace(settings, task="multimnist")), resume,
                    argv, log)
