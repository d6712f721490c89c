"""Training and evaluating a CapsNet on MultiMNIST: a fresh pairing of the training digits
every epoch, validation pairs from held-out digits, the paper's top-2 test metric."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

from capsnet.data.augment import to_model_input
from capsnet.data.splits import epoch_order
from capsnet.devices import pick_device
from capsnet.experiment import describe_run, run_epochs, write_results
from capsnet.multimnist import (DigitPairs, canvas_size, make_pairs, model_inputs, pair_loss,
                                pair_set, pairs_correct, top_two)
from capsnet.training.checkpoint import model_from_checkpoint
from capsnet.training.fit import build_for, prepare_data
from capsnet.training.loop import NonFiniteLossError
from capsnet.training.settings import TrainSettings

TEST_PAIRS = 10_000
TEST_SEED = 0  # the test pairs are the same for every run (`multimnist evaluate --seed`)
SEED_STRIDE = 1_000  # epoch generators are seeded with seed * SEED_STRIDE + epoch


def train_pairs_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
                      labels: torch.Tensor, order: torch.Tensor, batch_size: int, max_shift: int,
                      reconstruction_weight: float,
                      generator: Optional[torch.Generator] = None) -> dict:
    """One epoch over pairs whose first digits are ``images[order]`` (images (N, 28, 28)
    uint8, labels (N,) on the device) and whose partners and shifts are drawn from
    ``generator``. Returns {'train_loss', 'train_accuracy'} (accuracy: both digits right)."""
    model.train()
    device = images.device
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    for idx in order.split(batch_size):
        pairs = make_pairs(images, labels, idx, max_shift, generator)  # B pairs (B, S, S)
        x, digits = model_inputs(pairs)  # (B, 1, S, S), (B, 2, 1, S, S)
        loss, out = pair_loss(model, x, pairs.labels, digits, reconstruction_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach() * idx.numel()
        correct += pairs_correct(out.lengths.detach(), pairs.labels).sum()
    mean_loss = loss_sum.item() / max(order.numel(), 1)
    if not math.isfinite(mean_loss):
        raise NonFiniteLossError(f"MultiMNIST training loss became {mean_loss}")
    return {"train_loss": mean_loss, "train_accuracy": correct.item() / max(order.numel(), 1)}


@torch.no_grad()
def evaluate_pairs(model: nn.Module, pairs: DigitPairs, batch_size: int = 500) -> dict:
    """The paper's MultiMNIST metric: a pair counts as right when the two most active
    capsules are its two digits. Returns {'accuracy', 'error', 'pairs'}."""
    model.eval()
    correct = torch.zeros((), device=pairs.images.device, dtype=torch.long)
    for start in range(0, len(pairs), batch_size):
        batch = pairs.subset(slice(start, start + batch_size))
        out = model(to_model_input(batch.images))  # lengths (B, J)
        correct += pairs_correct(out.lengths, batch.labels).sum()
    accuracy = correct.item() / max(len(pairs), 1)
    return {"accuracy": accuracy, "error": 1.0 - accuracy, "pairs": len(pairs)}


@torch.no_grad()
def reconstruct_pairs(model: nn.Module, pairs: DigitPairs) -> tuple[torch.Tensor, ...]:
    """Reconstructions of each pair from its two most active capsules, one at a time:
    first (K, S, S), second (K, S, S) floats in [0, 1], and those capsules (K, 2)."""
    model.eval()
    if getattr(model, "decoder", None) is None:
        raise ValueError("this model has no decoder (trained with --reconstruction-weight 0)")
    out = model(to_model_input(pairs.images))  # poses (K, J, D)
    chosen = top_two(out.lengths)  # (K, 2)
    first = model.decoder(out.poses, chosen[:, 0])[:, 0]  # (K, S, S)
    second = model.decoder(out.poses, chosen[:, 1])[:, 0]  # (K, S, S)
    return first, second, chosen


def train_multimnist(settings: TrainSettings, test_pairs: int = TEST_PAIRS,
                     target_accuracy: Optional[float] = None, argv: Optional[list[str]] = None,
                     log: Callable[[str], None] = print) -> dict:
    """Train a CapsNet on MultiMNIST as ``settings`` say (``max_shift`` is each digit's
    shift; ``val_size`` held-out digits make as many validation pairs), then test the
    validation-selected model on ``test_pairs`` pairs of test digits. Writes a run
    directory at ``settings.out_dir``; returns (and writes) results.json."""
    if settings.model != "capsnet":
        raise ValueError("MultiMNIST training is for CapsNet (its two active capsules)")
    if settings.val_size < 1:
        raise ValueError("MultiMNIST training needs held-out validation digits (val_size > 0)")
    device = pick_device(settings.device)
    torch.manual_seed(settings.seed)
    run_dir = Path(settings.out_dir)
    data = prepare_data(settings, device)
    images, labels = data.train.images[data.train_idx], data.train.labels[data.train_idx]
    val = pair_set(data.train.images[data.val_idx], data.train.labels[data.val_idx],
                   len(data.val_idx), settings.seed, settings.max_shift)
    model, optimizer, scheduler = build_for(
        settings, data, device, image_size=canvas_size(images.shape[-1], settings.max_shift))
    config = model.config
    saved = {**settings.to_dict(), "protocol": "multimnist", "test_pairs": test_pairs,
             "target_accuracy": target_accuracy}
    describe_run(run_dir, saved, model, argv)
    log(f"MultiMNIST: {len(images)} training digits paired afresh each epoch, {len(val)} "
        f"validation pairs, {config.image_size}x{config.image_size} images; device {device}")

    def train_epoch(epoch: int) -> dict:
        order = epoch_order(len(images), settings.seed, epoch, device)
        g = torch.Generator(device=device).manual_seed(settings.seed * SEED_STRIDE + epoch)
        return train_pairs_epoch(model, optimizer, images, labels, order, settings.batch_size,
                                 settings.max_shift, settings.reconstruction_weight, g)

    state = run_epochs(run_dir, model, optimizer, scheduler, settings.epochs, train_epoch,
                       lambda: evaluate_pairs(model, val)["accuracy"], saved, target_accuracy,
                       log)
    best = model_from_checkpoint(run_dir / "best.pt", map_location=device)
    test = pair_set(data.test.images, data.test.labels, test_pairs, TEST_SEED, settings.max_shift)
    result = evaluate_pairs(best, test)
    log(f"MultiMNIST test: {100 * result['accuracy']:.2f}% of {len(test)} pairs with both digits "
        f"right (error {100 * result['error']:.2f}%), validation-selected epoch "
        f"{state['best_epoch']}")
    results = {**state, "test": result, "test_seed": TEST_SEED}
    write_results(run_dir, results)
    return results
