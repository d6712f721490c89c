"""The paper's shifts drawn for a whole epoch at its start (capsnet.data.augment_shift): what a
shift does to an image, that every one of the 25 positions comes up, and that a resumed run
draws the same shifts and ends where an uninterrupted one does."""
from __future__ import annotations

import torch

from capsnet.checkpoint import load_checkpoint
from capsnet.cli.main import main
from capsnet.data.augment_shift import epoch_shifts, shift_by
from capsnet.training import loop

MAX_SHIFT = 2


def test_a_corner_of_max_shift_keeps_the_image_and_zero_shifts_it_by_max_shift():
    images = torch.arange(2 * 5 * 5, dtype=torch.float32).view(2, 1, 5, 5)  # (B, C, H, W)
    corners = torch.tensor([[MAX_SHIFT, MAX_SHIFT], [0, 0]])  # (B, 2) (top, left)
    shifted = shift_by(images, corners, MAX_SHIFT)
    assert torch.equal(shifted[0], images[0])
    s = MAX_SHIFT
    assert torch.equal(shifted[1, :, s:, s:], images[1, :, :-s, :-s])  # down and right by s
    assert shifted[1, :, :s].abs().sum() == 0 and shifted[1, :, :, :s].abs().sum() == 0
    assert shift_by(images, corners, 0) is images  # no shift: the batch as it is


def test_an_epoch_draws_every_one_of_the_25_shifts_and_the_same_ones_for_the_same_seed():
    draw = epoch_shifts(5000, MAX_SHIFT, torch.Generator().manual_seed(7))  # (N, 2)
    assert draw.shape == (5000, 2) and draw.min() == 0 and draw.max() == 2 * MAX_SHIFT
    positions = torch.unique(draw[:, 0] * 5 + draw[:, 1])
    assert len(positions) == (2 * MAX_SHIFT + 1) ** 2
    assert torch.equal(draw, epoch_shifts(5000, MAX_SHIFT, torch.Generator().manual_seed(7)))
    assert not torch.equal(draw, epoch_shifts(5000, MAX_SHIFT, torch.Generator().manual_seed(8)))


def test_a_resumed_run_draws_the_same_shifts_and_ends_as_an_uninterrupted_one(
        tiny_mnist_dir, tmp_path, monkeypatch):
    draws: list[torch.Tensor] = []

    def recorded(*args, **kwargs):
        draws.append(epoch_shifts(*args, **kwargs))
        return draws[-1]
    monkeypatch.setattr(loop, "epoch_shifts", recorded)

    def train(out, *extra):
        assert main(["train", "--model", "cnn", "--preset", "tiny", "--no-download",
                     "--data-dir", str(tiny_mnist_dir), "--val-size", "0", "--subset", "128",
                     "--batch-size", "32", "--max-shift", str(MAX_SHIFT), "--no-progress",
                     "--out-dir", str(out), *extra]) == 0
    train(tmp_path / "full", "--epochs", "2")
    uninterrupted = list(draws)
    train(tmp_path / "part", "--epochs", "1")
    assert main(["train", "--resume", str(tmp_path / "part"), "--epochs", "2",
                 "--no-progress"]) == 0
    resumed = draws[len(uninterrupted):]
    assert len(uninterrupted) == len(resumed) == 2  # one draw an epoch
    assert not torch.equal(uninterrupted[0], uninterrupted[1])  # a new draw each epoch
    for a, b in zip(uninterrupted, resumed, strict=True):
        assert torch.equal(a, b)
    full, part = (load_checkpoint(tmp_path / name / "last.pt")["state_dict"]
                  for name in ("full", "part"))
    for name, tensor in full.items():
        torch.testing.assert_close(part[name], tensor, rtol=0, atol=1e-6)
