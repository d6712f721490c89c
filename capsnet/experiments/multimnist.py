"""MultiMNIST (Sabour et al. 2017, section 6): two digits of different classes, each shifted by
up to ``max_shift`` pixels on a 28 + 2 max_shift canvas, summed and clipped at 255; the loss
that trains both capsules and reconstructions, the top-2 metric, and training on a fresh
pairing of the training digits every epoch."""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from capsnet.data.image_dataset import PIXEL_MAX, epoch_order, to_model_input
from capsnet.data.transforms import place_on_canvas, random_shift
from capsnet.experiments import SEED_STRIDE, TEST_SEED
from capsnet.inference import require_decoder
from capsnet.losses import RECONSTRUCTION_WEIGHT, margin_loss, reconstruction_loss
from capsnet.models import unwrap
from capsnet.models.base import autocast_to
from capsnet.training import distributed
from capsnet.training.distributed import World
from capsnet.training.fit import data_overrides, protocol_data
from capsnet.training.loop import (
    Batch,
    MakeBatch,
    StepOptions,
    predict_scores,
    run_epoch,
    train_step,
)
from capsnet.training.runner import Log, Task, run_task
from capsnet.training.settings import TrainSettings

MAX_SHIFT = 4  # the paper: each digit shifted up to 4 pixels in each direction
DIGITS_PER_IMAGE = 2
TEST_PAIRS = 10_000


def canvas_size(digit_size: int, max_shift: int = MAX_SHIFT) -> int:
    """Side of the MultiMNIST images: 36 for 28x28 digits shifted by up to 4 pixels."""
    return digit_size + 2 * max_shift


def shift_for(model_image_size: int, digit_size: int) -> int:
    """The per-digit shift of a MultiMNIST model whose input is ``digit_size + 2 * shift`` wide."""
    shift = (model_image_size - digit_size) // 2
    if shift < 0:
        raise ValueError(f"the model takes {model_image_size}x{model_image_size} images, "
                         f"smaller than the {digit_size}x{digit_size} digits")
    return shift


@dataclass
class DigitPairs:
    """Overlays (N, S, S) uint8, their two different labels (N, 2) and each digit alone as
    placed (N, 2, S, S) (the reconstruction targets)."""

    images: torch.Tensor
    labels: torch.Tensor
    digits: torch.Tensor

    def __len__(self) -> int:
        return self.labels.shape[0]

    def subset(self, index) -> DigitPairs:
        return DigitPairs(self.images[index], self.labels[index], self.digits[index])

    def to(self, device) -> DigitPairs:
        return DigitPairs(self.images.to(device), self.labels.to(device), self.digits.to(device))


@dataclass(frozen=True)
class ClassIndex:
    """``labels`` (N,) grouped by class, made once per digit set (finding the classes syncs
    with the host): classes (P,), counts (P,), grouped indices (N,), group starts (P,)."""

    present: torch.Tensor
    counts: torch.Tensor
    by_class: torch.Tensor
    starts: torch.Tensor

    @classmethod
    def of(cls, labels: torch.Tensor) -> ClassIndex:
        present, counts = labels.unique(return_counts=True)  # (P,), (P,) sorted
        if present.numel() < DIGITS_PER_IMAGE:
            raise ValueError("MultiMNIST needs digits of at least two classes")
        by_class = torch.argsort(labels, stable=True)  # (N,): indices grouped by class
        return cls(present, counts, by_class, torch.cumsum(counts, 0) - counts)


def partner_indices(labels: torch.Tensor, first: torch.Tensor,
                    generator: torch.Generator | None = None,
                    index: ClassIndex | None = None) -> torch.Tensor:
    """For each of ``first`` (M,), a random index into ``labels`` of another class (the
    class uniform among the others present, then the example within it)."""
    device = labels.device
    index = index or ClassIndex.of(labels)
    classes = index.present.numel()
    own = torch.searchsorted(index.present, labels[first])  # (M,) position of each first class
    pick = torch.randint(0, classes - 1, first.shape, device=device,
                         generator=generator)  # (M,) among the P - 1 other classes
    other = pick + (pick >= own).long()  # (M,) skip the own class
    counts = index.counts[other]  # (M,)
    within = (torch.rand(first.shape, device=device, generator=generator)
              * counts).long().clamp_max(counts - 1)  # (M,)
    return index.by_class[index.starts[other] + within]  # (M,)


def make_pairs(images: torch.Tensor, labels: torch.Tensor, first: torch.Tensor,
               max_shift: int = MAX_SHIFT, generator: torch.Generator | None = None,
               index: ClassIndex | None = None) -> DigitPairs:
    """One pair per index of ``first`` (M,): that digit over a random digit of another class,
    each centred on the canvas and shifted, summed and clipped at 255; partners then shifts
    drawn from ``generator``."""
    second = partner_indices(labels, first, generator, index)  # (M,)
    both = torch.stack([first, second], dim=1)  # (M, 2)
    M, S = both.shape[0], canvas_size(images.shape[-1], max_shift)
    centred = place_on_canvas(images[both.flatten()], S)  # (2M, S, S)
    digits = random_shift(centred.unsqueeze(1), max_shift, generator)  # (2M, 1, S, S)
    digits = digits.view(M, DIGITS_PER_IMAGE, S, S)  # (M, 2, S, S)
    overlay = (digits[:, 0].int() + digits[:, 1].int()).clamp_max(PIXEL_MAX)  # (M, S, S)
    return DigitPairs(overlay.to(torch.uint8), labels[both], digits)


def pair_set(images: torch.Tensor, labels: torch.Tensor, count: int, seed: int,
             max_shift: int = MAX_SHIFT) -> DigitPairs:
    """A fixed set of ``count`` pairs, the same for a seed on every device (made on the CPU)."""
    g = torch.Generator().manual_seed(seed)
    first = torch.arange(count) % labels.numel()  # (count,)
    pairs = make_pairs(images.cpu(), labels.cpu(), first, max_shift, g)
    return pairs.to(images.device)


def two_hot(labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(B, 2) class pairs -> (B, J) 0/1 targets with both classes on."""
    return F.one_hot(labels, num_classes).amax(dim=1)  # (B, J)


def pair_loss(model: nn.Module, x: torch.Tensor, labels: torch.Tensor, digits: torch.Tensor,
              reconstruction_weight: float = RECONSTRUCTION_WEIGHT):
    """The paper's MultiMNIST loss: margin loss with both capsules as targets plus
    ``reconstruction_weight`` times each digit's reconstruction loss from its own capsule.
    x (B, 1, S, S), labels (B, 2), digits (B, 2, 1, S, S)."""
    out = model(x, labels[:, 0])  # lengths (B, J), poses (B, J, D), reconstruction of digit 1
    loss = margin_loss(out.scores.float(), two_hot(labels, out.scores.shape[-1]))
    if out.reconstructions is not None and reconstruction_weight > 0:
        capsnet = unwrap(model)  # the decoder of the model inside a DDP wrapper
        with autocast_to(x.device, capsnet.compute_dtype):
            second = capsnet.decoder(out.poses, labels[:, 1])  # (B, 1, S, S)
        both = (reconstruction_loss(out.reconstructions, digits[:, 0])
                + reconstruction_loss(second, digits[:, 1]))
        loss = loss + reconstruction_weight * both
    return loss, out


def top_two(lengths: torch.Tensor) -> torch.Tensor:
    """The two most active capsules (B, 2), most active first, of lengths (B, J)."""
    return lengths.topk(DIGITS_PER_IMAGE, dim=-1).indices  # (B, 2)


def pairs_correct(lengths: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B,) True where the two most active capsules are the two labels (B, 2), as a set."""
    return (top_two(lengths).sort(dim=-1).values == labels.sort(dim=-1).values).all(dim=-1)


def model_inputs(pairs: DigitPairs) -> tuple[torch.Tensor, torch.Tensor]:
    """Float model input (B, 1, S, S) and reconstruction targets (B, 2, 1, S, S) in [0, 1]."""
    return to_model_input(pairs.images), to_model_input(pairs.digits).unsqueeze(2)


def pairs_batch(images: torch.Tensor, labels: torch.Tensor, max_shift: int,
                generator: torch.Generator | None = None) -> MakeBatch:
    """The training batch of pairs whose first digits are ``images[idx]`` (N, 28, 28), each
    digit shifted by up to ``max_shift``, partners and shifts from ``generator``: the model
    input (B, 1, S, S), the labels (B, 2) and the digits (B, 2, 1, S, S)."""
    index = ClassIndex.of(labels)  # once per epoch: no host sync per step

    def make_batch(idx: torch.Tensor) -> Batch:
        pairs = make_pairs(images, labels, idx, max_shift, generator, index)  # (B, S, S)
        x, digits = model_inputs(pairs)  # (B, 1, S, S), (B, 2, 1, S, S)
        return x, pairs.labels, digits
    return make_batch


def pairs_loss(model: nn.Module, batch: Batch, run_fraction=None,
               reconstruction_weight: float = RECONSTRUCTION_WEIGHT
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pair_loss` of a batch of :func:`pairs_batch`, and how many pairs have both
    digits right."""
    x, labels, digits = batch
    loss, out = pair_loss(model, x, labels, digits, reconstruction_weight)
    return loss, pairs_correct(out.scores.detach(), labels).sum()


def train_pairs_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
                      labels: torch.Tensor, order: torch.Tensor, options: StepOptions,
                      generator: torch.Generator | None = None) -> dict:
    """One epoch over pairs whose first digits are ``images[order]`` (:func:`pairs_batch`).
    Returns {'train_loss', 'train_accuracy'} (both digits right)."""
    model.train()
    loss = functools.partial(pairs_loss, reconstruction_weight=options.reconstruction_weight)
    step = functools.partial(train_step, model, optimizer, loss, grad_scaler=options.grad_scaler)
    result = run_epoch(step, order, pairs_batch(images, labels, options.max_shift, generator),
                       options.batch_size, **options.read_backs())
    return {"train_loss": result["loss"], "train_accuracy": result["accuracy"]}


def evaluate_pairs(model: nn.Module, pairs: DigitPairs, batch_size: int = 500,
                   world: World | None = None) -> dict:
    """The paper's MultiMNIST metric (the two most active capsules are the pair's digits),
    each rank taking every world-th pair. Returns {'accuracy', 'error', 'pairs'}."""
    world = world or World()
    mine = pairs.subset(slice(world.rank, None, world.size))  # every world-th pair
    lengths = predict_scores(model, mine.images, batch_size)  # (n, J)
    correct = pairs_correct(lengths, mine.labels).sum()
    accuracy = distributed.all_reduce_sum(correct, world).item() / max(len(pairs), 1)
    return {"accuracy": accuracy, "error": 1.0 - accuracy, "pairs": len(pairs)}


@torch.no_grad()
def reconstruct_pairs(model: nn.Module, pairs: DigitPairs) -> tuple[torch.Tensor, ...]:
    """Each pair reconstructed from its two most active capsules: first, second (K, S, S)
    in [0, 1], and those capsules (K, 2)."""
    model.eval()
    require_decoder(model)
    out = model(to_model_input(pairs.images))  # poses (K, J, D)
    chosen = top_two(out.scores)  # (K, 2)
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
        self.train, val, self.test = protocol_data(s, device, "MultiMNIST")
        self.images, self.labels = self.train.images, self.train.labels
        self.val = pair_set(val.images, val.labels, len(val), s.seed, s.max_shift)
        self.epoch_size = len(self.labels)
        self.side = canvas_size(self.images.shape[-1], s.max_shift)

    def model_overrides(self) -> dict:
        return data_overrides(self.settings, self.train, image_size=self.side)

    def describe(self, world: World) -> str:
        return (f"MultiMNIST: {len(self.images)} training digits paired afresh each epoch, "
                f"{len(self.val)} validation pairs, {self.side}x{self.side} images; device "
                f"{world.device}")

    def epoch_batches(self, model: nn.Module, epoch: int, world: World
                      ) -> tuple[torch.Tensor, MakeBatch]:
        s, device = self.settings, world.device
        order = epoch_order(len(self.images), s.seed, epoch, device)
        order = distributed.shard_order(order, world.rank, world.size)
        g = torch.Generator(device=device).manual_seed(s.seed * SEED_STRIDE + epoch + world.rank)
        return order, pairs_batch(self.images, self.labels, s.max_shift, g)

    def batch_loss(self, model: nn.Module, batch: Batch, run_fraction) -> tuple:
        return pairs_loss(model, batch, run_fraction, self.settings.reconstruction_weight)

    def validate(self, model: nn.Module, world: World) -> dict:
        """Validation pairs shared out to the ranks and their counts summed."""
        return {"val_accuracy": evaluate_pairs(model, self.val, world=world)["accuracy"]}

    def final_report(self, final: nn.Module, best: nn.Module | None, state: dict,
                     log: Log) -> dict:
        s = self.settings
        test = pair_set(self.test.images, self.test.labels, s.test_pairs or TEST_PAIRS, TEST_SEED,
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
