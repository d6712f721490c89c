"""Validation splits, per-epoch orders, and the batch preparation (scaling, random shift)."""
from __future__ import annotations

import pytest
import torch

from capsnet.data.image_dataset import epoch_order, stratified_split, to_model_input
from capsnet.data.transforms import random_shift


def unbalanced_labels(seed: int = 0) -> torch.Tensor:
    """1,000 labels over 10 classes with very different frequencies (10 to 190)."""
    counts = [10, 30, 50, 70, 90, 110, 130, 150, 170, 190]
    labels = torch.cat([torch.full((c,), k) for k, c in enumerate(counts)])
    return labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))]


# --- stratified_split ---------------------------------------------------------------------

@pytest.mark.parametrize("val_size", [0, 1, 7, 100, 333, 999])
def test_split_is_disjoint_sorted_and_covers_everything(val_size):
    labels = unbalanced_labels()
    train, val = stratified_split(labels, val_size, seed=0)
    assert len(val) == val_size and len(train) + len(val) == len(labels)
    both = torch.cat([train, val])
    assert torch.equal(both.sort().values, torch.arange(len(labels)))  # disjoint and complete
    assert torch.equal(train, train.sort().values) and torch.equal(val, val.sort().values)
    assert train.dtype == val.dtype == torch.long


@pytest.mark.parametrize("val_size", [100, 333])
def test_split_keeps_class_proportions_within_one(val_size):
    labels = unbalanced_labels()
    _, val = stratified_split(labels, val_size, seed=3)
    counts = torch.bincount(labels, minlength=10).double()
    got = torch.bincount(labels[val], minlength=10).double()
    quota = counts * val_size / len(labels)
    assert ((got - quota).abs() < 1 + 1e-9).all(), (got, quota)


def test_split_is_deterministic_per_seed():
    labels = unbalanced_labels()
    a = stratified_split(labels, 200, seed=5)
    b = stratified_split(labels, 200, seed=5)
    c = stratified_split(labels, 200, seed=6)
    assert torch.equal(a[1], b[1]) and torch.equal(a[0], b[0])
    assert not torch.equal(a[1], c[1])


def test_split_rejects_bad_sizes():
    labels = unbalanced_labels()
    with pytest.raises(ValueError):
        stratified_split(labels, len(labels), seed=0)
    with pytest.raises(ValueError):
        stratified_split(labels, -1, seed=0)


# --- epoch_order --------------------------------------------------------------------------

def test_epoch_order_is_a_permutation_fixed_by_seed_and_epoch():
    a = epoch_order(500, seed=1, epoch=3)
    assert torch.equal(a.sort().values, torch.arange(500))
    assert torch.equal(a, epoch_order(500, seed=1, epoch=3))
    torch.manual_seed(123)  # the global RNG does not matter
    assert torch.equal(a, epoch_order(500, seed=1, epoch=3))
    assert not torch.equal(a, epoch_order(500, seed=1, epoch=4))
    assert not torch.equal(a, epoch_order(500, seed=2, epoch=3))


# --- to_model_input -----------------------------------------------------------------------

def test_to_model_input_scales_and_adds_the_channel():
    images = torch.tensor([[[0, 255], [51, 102]]], dtype=torch.uint8)  # (1, 2, 2)
    x = to_model_input(images)
    assert x.shape == (1, 1, 2, 2) and x.dtype == torch.float32
    torch.testing.assert_close(x[0, 0], torch.tensor([[0.0, 1.0], [0.2, 0.4]]))
    assert to_model_input(images.unsqueeze(1)).shape == (1, 1, 2, 2)
    assert images[0, 0, 1] == 255  # the input is not modified


# --- random_shift -------------------------------------------------------------------------

def shift_image(image: torch.Tensor, dy: int, dx: int) -> torch.Tensor:
    """Reference: image (C, H, W) moved down by dy and right by dx, zero fill."""
    C, H, W = image.shape
    out = torch.zeros_like(image)
    rows = [y for y in range(H) if 0 <= y - dy < H]  # output rows that receive a pixel
    cols = [x for x in range(W) if 0 <= x - dx < W]
    for y in rows:
        out[:, y, cols] = image[:, y - dy, [x - dx for x in cols]]
    return out


def find_shift(original: torch.Tensor, shifted: torch.Tensor, max_shift: int):
    """The (dy, dx) in [-max_shift, max_shift]^2 that turns original (C, H, W), whose pixels
    are distinct and nonzero, into shifted; None if there is none."""
    c, y, x = (shifted != 0).nonzero()[0].tolist()  # a pixel that came from the original
    _, y0, x0 = (original == shifted[c, y, x]).nonzero()[0].tolist()
    dy, dx = y - y0, x - x0
    if max(abs(dy), abs(dx)) > max_shift or not torch.equal(shift_image(original, dy, dx), shifted):
        return None
    return dy, dx


def distinct_images(B: int, C: int = 1, H: int = 9, W: int = 7) -> torch.Tensor:
    """Images with distinct, nonzero pixel values everywhere, so any shift is identifiable."""
    return (torch.arange(B * C * H * W, dtype=torch.float32) + 1).view(B, C, H, W)


def test_each_image_is_moved_by_its_own_drawn_offsets():
    max_shift = 2
    images = distinct_images(300, C=2)
    shifted = random_shift(images, max_shift, torch.Generator().manual_seed(0))
    assert shifted.shape == images.shape and shifted.dtype == images.dtype
    offsets = [find_shift(images[i], shifted[i], max_shift) for i in range(len(images))]
    assert None not in offsets  # every output is its input shifted, with zero fill
    assert len(set(offsets)) == (2 * max_shift + 1) ** 2  # all 25 offsets are drawn
    assert len({o[0] for o in offsets[:20]}) > 1  # independently per image


def test_shift_zero_fill_and_content_preserved():
    image = torch.zeros(1, 1, 5, 5)
    image[0, 0, 2, 2] = 1.0  # one bright pixel in the middle
    shifted = random_shift(image.expand(50, 1, 5, 5), 2, torch.Generator().manual_seed(1))
    assert torch.equal(shifted.sum(dim=(1, 2, 3)), torch.ones(50))  # nothing lost or added
    positions = {tuple((s[0] == 1).nonzero()[0].tolist()) for s in shifted}
    assert positions <= {(y, x) for y in range(5) for x in range(5)}
    assert len(positions) > 10


def test_shift_is_reproducible_with_a_generator():
    images = distinct_images(16)
    a = random_shift(images, 2, torch.Generator().manual_seed(7))
    b = random_shift(images, 2, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


def test_max_shift_zero_is_the_identity():
    images = distinct_images(4)
    assert torch.equal(random_shift(images, 0), images)
