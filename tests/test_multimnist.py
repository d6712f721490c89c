"""MultiMNIST: the seeded pair generator, the two-capsule loss, the top-2 metric, and the
`capsnet multimnist` command end to end on tiny data."""
from __future__ import annotations

import json

import pytest
import torch

from capsnet.checkpoint import model_from_checkpoint
from capsnet.cli.main import main
from capsnet.experiments.multimnist import (
    canvas_size,
    evaluate_pairs,
    make_pairs,
    model_inputs,
    pair_loss,
    pair_set,
    pairs_correct,
    partner_indices,
    reconstruct_pairs,
    train_pairs_epoch,
    two_hot,
)
from capsnet.losses import margin_loss, reconstruction_loss
from capsnet.models import build_model, make_config
from capsnet.training.loop import StepOptions

TINY = dict(conv1_channels=8, primary_types=4, decoder_hidden=(16, 32))  # fast unit tests


def tiny_capsnet() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(make_config("capsnet", "small", image_size=36, **TINY))


def digits(n: int = 60, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """n random 28x28 'digits' with ink only in the central 20x20 (as MNIST), labels (n,)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.zeros(n, 28, 28, dtype=torch.uint8)
    images[:, 4:24, 4:24] = torch.randint(0, 256, (n, 20, 20), generator=g, dtype=torch.uint8)
    return images, torch.arange(n) % 10


def find_offset(canvas: torch.Tensor, digit: torch.Tensor) -> tuple[int, int] | None:
    """(dy, dx) such that ``digit`` sits at offset (4 + dy, 4 + dx) of the 36x36 canvas."""
    for top in range(canvas.shape[0] - digit.shape[0] + 1):
        for left in range(canvas.shape[1] - digit.shape[1] + 1):
            window = canvas[top:top + 28, left:left + 28]
            if torch.equal(window, digit) and int(canvas.sum()) == int(digit.sum()):
                return top - 4, left - 4
    return None


def test_partners_are_of_another_class_and_seeded():
    labels = torch.tensor([0, 0, 0, 1, 2, 2, 5, 5, 5, 5])
    first = torch.arange(10).repeat(50)  # (500,)
    a = partner_indices(labels, first, torch.Generator().manual_seed(1))
    b = partner_indices(labels, first, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
    assert (labels[a] != labels[first]).all()
    assert set(labels[a].tolist()) == {0, 1, 2, 5}  # every other class is used
    with pytest.raises(ValueError, match="two classes"):
        partner_indices(torch.zeros(4, dtype=torch.long), torch.arange(4))


def test_pairs_overlay_two_shifted_digits_of_different_classes():
    images, labels = digits()
    first = torch.arange(20)
    pairs = make_pairs(images, labels, first, 4, torch.Generator().manual_seed(0))
    assert canvas_size(28) == 36
    assert pairs.images.shape == (20, 36, 36) and pairs.digits.shape == (20, 2, 36, 36)
    assert torch.equal(pairs.labels[:, 0], labels[first])
    assert (pairs.labels[:, 0] != pairs.labels[:, 1]).all()
    summed = pairs.digits[:, 0].int() + pairs.digits[:, 1].int()
    assert torch.equal(pairs.images, summed.clamp_max(255).to(torch.uint8))
    offsets = []
    for k in range(20):
        dy_dx = find_offset(pairs.digits[k, 0], images[first[k]])
        assert dy_dx is not None and max(abs(dy_dx[0]), abs(dy_dx[1])) <= 4
        offsets.append(dy_dx)
    assert len(set(offsets)) > 1  # the shifts vary


def test_pair_sets_are_deterministic_for_a_seed():
    images, labels = digits()
    a, b = pair_set(images, labels, 30, seed=7), pair_set(images, labels, 30, seed=7)
    c = pair_set(images, labels, 30, seed=8)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert torch.equal(a.digits, b.digits)
    assert not torch.equal(a.images, c.images)
    assert torch.equal(a.labels[:, 0], labels[:30])  # cycles through the digits


def test_two_hot_and_the_order_free_top_two_metric():
    labels = torch.tensor([[3, 7], [1, 2], [0, 9]])
    assert two_hot(labels, 10).sum(1).tolist() == [2, 2, 2]
    assert two_hot(labels, 10)[0].nonzero().flatten().tolist() == [3, 7]
    lengths = torch.full((3, 10), 0.05)
    lengths[0, [7, 3]] = torch.tensor([0.9, 0.8])  # right, other order
    lengths[1, [1, 5]] = torch.tensor([0.9, 0.8])  # one wrong
    lengths[2, [0, 9, 4]] = torch.tensor([0.9, 0.7, 0.8])  # the second is third
    assert pairs_correct(lengths, labels).tolist() == [True, False, False]


def test_pair_loss_is_two_hot_margin_plus_both_reconstructions():
    model = tiny_capsnet()
    images, labels = digits(8)
    pairs = make_pairs(images, labels, torch.arange(8), 4, torch.Generator().manual_seed(0))
    x, targets = model_inputs(pairs)  # (8, 1, 36, 36), (8, 2, 1, 36, 36)
    loss, out = pair_loss(model, x, pairs.labels, targets, reconstruction_weight=0.0005)
    first = model.decoder(out.poses, pairs.labels[:, 0])  # (8, 1, 36, 36)
    second = model.decoder(out.poses, pairs.labels[:, 1])
    expected = (margin_loss(out.scores, two_hot(pairs.labels, 10))
                + 0.0005 * (reconstruction_loss(first, targets[:, 0])
                            + reconstruction_loss(second, targets[:, 1])))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.allclose(out.reconstructions, first)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_one_epoch_trains_and_the_metric_is_a_fraction():
    model = tiny_capsnet()
    before = [p.detach().clone() for p in model.parameters()]
    images, labels = digits(20)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    options = StepOptions(batch_size=10, max_shift=4, reconstruction_weight=0.0005)
    row = train_pairs_epoch(model, optimizer, images, labels, torch.arange(20), options,
                            torch.Generator().manual_seed(0))
    assert row["train_loss"] > 0 and 0 <= row["train_accuracy"] <= 1
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=False))
    result = evaluate_pairs(model, pair_set(images, labels, 15, seed=1), batch_size=10)
    assert result["pairs"] == 15 and result["error"] == pytest.approx(1 - result["accuracy"])
    first, second, chosen = reconstruct_pairs(model, pair_set(images, labels, 3, seed=1))
    assert first.shape == second.shape == (3, 36, 36) and chosen.shape == (3, 2)
    assert (chosen[:, 0] != chosen[:, 1]).all()


@pytest.mark.slow
def test_multimnist_cli_train_evaluate_figure(tiny_mnist_dir, tmp_path, capsys):
    data = ["--data-dir", str(tiny_mnist_dir), "--no-download"]
    run = tmp_path / "mm"
    assert main(["multimnist", "train", "--preset", "small", *data, "--epochs", "1",
                 "--subset", "30", "--val-size", "20", "--batch-size", "30",
                 "--test-pairs", "20", "--out-dir", str(run)]) == 0
    for name in ("config.json", "command.txt", "metrics.csv", "last.pt", "best.pt",
                 "results.json"):
        assert (run / name).exists(), name
    results = json.loads((run / "results.json").read_text())
    assert results["test"]["pairs"] == 20 and results["epochs"] == 1
    model = model_from_checkpoint(run / "best.pt")
    assert model.config.image_size == 36 and model.config.num_primary_caps == 8 * 10 * 10
    capsys.readouterr()
    assert main(["multimnist", "evaluate", str(run / "best.pt"), *data, "--pairs", "20",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pairs"] == 20
    assert report["accuracy"] == pytest.approx(results["test"]["accuracy"])  # same test pairs
    figure = tmp_path / "pairs.png"
    assert main(["multimnist", "figure", str(run / "best.pt"), *data, "--count", "3",
                 "--out", str(figure)]) == 0
    assert figure.stat().st_size > 0


def test_multimnist_cli_refuses_a_cnn(tiny_mnist_dir, tmp_path, capsys):
    from capsnet.checkpoint import save_checkpoint

    path = tmp_path / "cnn.pt"
    save_checkpoint(path, build_model(make_config("cnn", "small", image_size=36)))
    assert main(["multimnist", "evaluate", str(path), "--data-dir", str(tiny_mnist_dir),
                 "--no-download"]) == 1
    assert "needs a CapsNet checkpoint" in capsys.readouterr().err
