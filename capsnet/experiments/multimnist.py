"""MultiMNIST (Sabour et al. 2017, section 6): two digits of different classes, each shifted by
up to ``max_shift`` pixels on a 28 + 2 max_shift canvas, summed and clipped at 255; the loss
that trains both capsules and reconstructions, and the top-2 metric."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from capsnet.data.augment import random_shift
from capsnet.data.image_dataset import PIXEL_MAX, to_model_input
from capsnet.data.transforms import place_on_canvas
from capsnet.losses import RECONSTRUCTION_WEIGHT, margin_loss, reconstruction_loss
from capsnet.models import unwrap
from capsnet.models.base import autocast_to

MAX_SHIFT = 4  # the paper: each digit shifted up to 4 pixels in each direction
DIGITS_PER_IMAGE = 2


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


def shift_on_canvas(digits: torch.Tensor, max_shift: int = MAX_SHIFT,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Centre each digit (M, H, W) on an H + 2 max_shift canvas, shifted randomly -> (M, S, S)."""
    centred = place_on_canvas(digits, canvas_size(digits.shape[-1], max_shift))  # (M, S, S)
    return random_shift(centred.unsqueeze(1), max_shift, generator).squeeze(1)  # (M, S, S)


def overlay(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Pixel-wise sum of two uint8 image batches, clipped at 255."""
    return (a.int() + b.int()).clamp_max(PIXEL_MAX).to(torch.uint8)


def make_pairs(images: torch.Tensor, labels: torch.Tensor, first: torch.Tensor,
               max_shift: int = MAX_SHIFT, generator: torch.Generator | None = None,
               index: ClassIndex | None = None) -> DigitPairs:
    """One pair per index of ``first`` (M,): that digit over a random digit of another class,
    partners then shifts drawn from ``generator``."""
    second = partner_indices(labels, first, generator, index)  # (M,)
    both = torch.stack([first, second], dim=1)  # (M, 2)
    M = both.shape[0]
    digits = shift_on_canvas(images[both.flatten()], max_shift, generator)  # (2M, S, S)
    digits = digits.view(M, DIGITS_PER_IMAGE, *digits.shape[-2:])  # (M, 2, S, S)
    return DigitPairs(overlay(digits[:, 0], digits[:, 1]), labels[both], digits)


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
    loss = margin_loss(out.lengths.float(), two_hot(labels, out.lengths.shape[-1]))
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
