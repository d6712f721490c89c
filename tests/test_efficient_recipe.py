"""Efficient-CapsNet's recipe (the authors' schedule as --model efficient's default, the exp
schedule's floor) and its MNIST augmentation: each transform by hand on tiny images and
against a slow transcription of the library it stands for (OpenCV's warpAffine, TensorFlow's
antialiased Lanczos resize), its draws, determinism, the training loop's pairing of images
and labels, and runs through the command line."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from capsnet.checkpoint import load_checkpoint
from capsnet.cli.args import settings_from_args
from capsnet.cli.main import build_parser, main
from capsnet.data.augment_efficient import (
    efficient_augment,
    erase,
    margin_shift,
    margins,
    random_erase,
    random_margin_shift,
    random_squeeze,
    roll,
    rotate,
    rotation_draws,
    squeeze,
)
from capsnet.data.image_dataset import to_model_input
from capsnet.models import ModelOutput
from capsnet.training import TrainSettings
from capsnet.training.loop import StepOptions, train_one_epoch
from capsnet.training.metrics_log import read_metrics
from capsnet.training.optimisation import Schedule, make_scheduler
from capsnet.training.settings import FAST_RECIPE, PAPER_RECIPE, recipe_for
from tests.conftest import make_fake_digits

# --- the recipe -------------------------------------------------------------------------------


def test_the_paper_recipe_of_efficient_capsnet_is_its_authors():
    s = TrainSettings(model="efficient")
    # config.json: lr 5e-4, lr_dec 0.97, batch_size 16, epochs 150; tools.py: floor 5e-5
    assert (s.epochs, s.batch_size, s.lr, s.schedule, s.lr_decay, s.min_lr) == (
        150, 16, 5e-4, "exp", 0.97, 5e-5)
    assert (s.warmup_epochs, s.ema_decay, s.augment, s.max_shift) == (0.0, 0.0, "efficient", 0)


def test_capsnet_and_the_cnn_keep_the_paper_recipe():
    for model in ("capsnet", "cnn"):
        assert recipe_for("paper", model) == PAPER_RECIPE
        assert recipe_for("fast", model) == FAST_RECIPE
    s = TrainSettings()
    assert (s.batch_size, s.lr_decay, s.min_lr, s.augment, s.max_shift) == (128, 0.96, 0.0,
                                                                            "shift", 2)
    with pytest.raises(ValueError, match="unknown recipe"):
        recipe_for("slow", "efficient")


def test_what_a_run_names_wins_over_the_recipe():
    s = TrainSettings(model="efficient", batch_size=32, lr_decay=0.9, min_lr=0.0, epochs=3,
                      lr=1e-3)
    assert (s.batch_size, s.lr_decay, s.min_lr, s.epochs, s.lr) == (32, 0.9, 0.0, 3, 1e-3)
    shifted = TrainSettings(model="efficient", augment="shift")
    assert shifted.max_shift == 2  # the 'shift' augmentation's pixels, when it is chosen
    assert TrainSettings(model="efficient", augment="shift", max_shift=3).max_shift == 3
    assert TrainSettings(augment="efficient").max_shift == 0  # CapsNet may take it too


@pytest.mark.parametrize("bad, match", [
    ({"augment": "rotate"}, "unknown augmentation"),
    ({"model": "efficient", "max_shift": 2}, "max_shift 2 needs augment 'shift'"),
    ({"model": "efficient", "crop": 24}, "crop takes the place"),
])
def test_augmentation_settings_that_cannot_work_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        TrainSettings(**bad)


def test_the_fast_recipe_of_efficient_capsnet_is_the_fast_one_at_its_rate():
    s = TrainSettings(model="efficient", recipe="fast")
    assert s.lr == pytest.approx(FAST_RECIPE["lr_scale"] * 5e-4)
    assert s.min_lr == pytest.approx(FAST_RECIPE["min_lr"] * 5e-4 / 1e-3)
    # its authors' augmentation, and longer than CapsNet's 15 epochs (its registry entry says why)
    assert (s.epochs, s.batch_size, s.schedule, s.ema_decay, s.augment, s.max_shift) == (
        25, FAST_RECIPE["batch_size"], "cosine", FAST_RECIPE["ema_decay"], "efficient", 0)
    assert s.warmup_epochs == FAST_RECIPE["warmup_epochs"] and s.ema_warmup


def test_runs_saved_before_the_setting_keep_their_shifts():
    saved = TrainSettings(model="efficient", augment="shift", max_shift=2).to_dict()
    del saved["augment"]
    assert TrainSettings.from_dict(saved).augment == "shift"


def test_the_command_line_fills_the_recipe_and_takes_what_is_given():
    def parsed(*argv: str) -> TrainSettings:
        return settings_from_args(build_parser().parse_args(["train", *argv]))

    assert parsed("--model", "efficient") == TrainSettings(model="efficient",
                                                           out_dir="runs/latest")
    given = parsed("--model", "efficient", "--augment", "shift", "--batch-size", "64")
    assert (given.augment, given.max_shift, given.batch_size, given.lr_decay) == (
        "shift", 2, 64, 0.97)
    assert parsed("--augment", "efficient").max_shift == 0
    repeat = settings_from_args(build_parser().parse_args(["repeat", "--model", "efficient"]))
    assert (repeat.batch_size, repeat.augment) == (16, "efficient")


# --- the schedule's floor --------------------------------------------------------------------


def adam(lr: float) -> torch.optim.Adam:
    return torch.optim.Adam([nn.Parameter(torch.zeros(2))], lr=lr)


def epoch_rates(optimizer, scheduler, epochs: int) -> list[float]:
    rates = []
    for _ in range(epochs):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


def test_the_exp_schedule_stops_at_the_floor_as_learn_scheduler_does():
    settings = TrainSettings(model="efficient")
    optimizer = adam(settings.lr)
    scheduler = make_scheduler(optimizer, settings, steps_per_epoch=1)
    rates = epoch_rates(optimizer, scheduler, 150)
    # utils/tools.py: lr * lr_dec ** epoch, 5e-5 when that is below it
    assert rates == pytest.approx([max(5e-5, 5e-4 * 0.97 ** e) for e in range(150)], rel=1e-12)
    assert rates[75] > 5e-5 * (1 + 1e-9)
    assert rates[76:] == pytest.approx([5e-5] * 74, rel=1e-12)  # the floor from epoch 77 on


def test_a_resumed_floored_schedule_goes_on_exactly():
    optimizer = adam(1.0)
    settings = TrainSettings(lr=1.0, lr_decay=0.5, min_lr=0.1)
    scheduler = make_scheduler(optimizer, settings, steps_per_epoch=1)
    epoch_rates(optimizer, scheduler, 2)
    resumed_optimizer = adam(1.0)
    resumed = make_scheduler(resumed_optimizer, TrainSettings(lr=1.0, lr_decay=0.5), 1)
    resumed_optimizer.load_state_dict(optimizer.state_dict())
    resumed.load_state_dict(scheduler.state_dict())  # the floor comes with the state
    assert epoch_rates(resumed_optimizer, resumed, 3) == epoch_rates(optimizer, scheduler, 3)
    assert resumed_optimizer.param_groups[0]["lr"] == pytest.approx(0.1)


def test_the_per_step_exp_staircase_has_the_floor_too():
    # x 0.5 per epoch of 2 steps, floor 0.3
    staircase = Schedule("exp", warmup_steps=0, total_steps=0, floor=0.3, steps_per_epoch=2,
                         decay=0.5)
    assert [staircase(s) for s in range(6)] == [1, 1, 0.5, 0.5, 0.3, 0.3]


# --- 1. rotation -----------------------------------------------------------------------------


def opencv_rotate_reference(image: torch.Tensor, degrees: float) -> torch.Tensor:
    """OpenCV's warpAffine(image, getRotationMatrix2D((W/2, H/2), degrees, 1), (W, H)) for
    one float image (H, W), pixel by pixel in Python floats: the matrix, its inverse
    (invertAffineTransform), the fixed-point coordinates (1/1024 pixel, then 1/32) and the
    bilinear weights with zeros outside."""
    H, W = image.shape
    cx, cy = W / 2, H / 2
    a, b = math.cos(math.radians(degrees)), math.sin(math.radians(degrees))
    m = [[a, b, (1 - a) * cx - b * cy], [-b, a, b * cx + (1 - a) * cy]]
    d = 1 / (m[0][0] * m[1][1] - m[0][1] * m[1][0])
    a11, a12, a21, a22 = m[1][1] * d, -m[0][1] * d, -m[1][0] * d, m[0][0] * d
    b1 = -a11 * m[0][2] - a12 * m[1][2]
    b2 = -a21 * m[0][2] - a22 * m[1][2]
    out = torch.zeros(H, W, dtype=torch.float64)
    for y in range(H):
        x0, y0 = round((a12 * y + b1) * 1024) + 16, round((a22 * y + b2) * 1024) + 16
        for x in range(W):
            sx, sy = (x0 + round(a11 * x * 1024)) >> 5, (y0 + round(a21 * x * 1024)) >> 5
            fx, fy = (sx & 31) / 32, (sy & 31) / 32
            for dy, dx, w in ((0, 0, (1 - fy) * (1 - fx)), (0, 1, (1 - fy) * fx),
                              (1, 0, fy * (1 - fx)), (1, 1, fy * fx)):
                r, c = (sy >> 5) + dy, (sx >> 5) + dx
                if 0 <= r < H and 0 <= c < W:
                    out[y, x] += float(image[r, c]) * w
    return out


def test_a_quarter_turn_by_hand():
    """About (W/2, H/2) = (2, 2) of a 4x4 image: destination (y, x) takes source (row x,
    column 4 - y), counter-clockwise as displayed: torch.rot90 moved down by one row."""
    image = torch.zeros(1, 1, 4, 4)
    image[0, 0, 0, 3] = 1.0  # top right ...
    turned = rotate(image, torch.tensor([90.0]))
    expected = torch.zeros(1, 1, 4, 4)
    expected[0, 0, 1, 0] = 1.0  # ... to the left, one row below the top
    assert torch.equal(turned, expected)
    pattern = torch.arange(1.0, 17.0).view(1, 1, 4, 4)
    shifted_rot90 = F.pad(torch.rot90(pattern, 1, dims=(-2, -1)), (0, 0, 1, 0))[..., :4, :]
    assert torch.equal(rotate(pattern, torch.tensor([90.0])), shifted_rot90)
    assert torch.equal(rotate(pattern, torch.tensor([0.0])), pattern)


@pytest.mark.parametrize("degrees", [-29.0, -4.0, 13.0, 27.0, 45.0])
def test_rotation_equals_opencvs_algorithm(degrees):
    image = torch.rand(1, 1, 9, 7, generator=torch.Generator().manual_seed(1))
    expected = opencv_rotate_reference(image[0, 0].double(), degrees)
    torch.testing.assert_close(rotate(image, torch.tensor([degrees]))[0, 0].double(), expected,
                               rtol=0, atol=1e-6)


def test_half_of_the_images_are_turned_by_whole_degrees_up_to_29():
    degrees, turned = rotation_draws(20000, torch.Generator().manual_seed(0),
                                     torch.device("cpu"))
    assert abs(turned.float().mean().item() - 0.5) < 0.02
    assert torch.equal(degrees, degrees.round()) and degrees.abs().max().item() == 29
    # int(30 r), r ~ N(0, 0.33): 0 when |r| < 1/30, P = 0.0805
    assert abs((degrees == 0).float().mean().item() - 0.0805) < 0.01
    assert abs(degrees.std().item() - 9.4) < 0.3  # 30 x 0.33, less the truncation


# --- 2. shift into the margins ---------------------------------------------------------------


def blob(size: int, top: int, left: int, height: int, width: int) -> torch.Tensor:
    image = torch.zeros(1, 1, size, size)
    image[..., top:top + height, left:left + width] = 1.0
    return image


def test_margins_and_shift_amounts_by_hand():
    image = blob(6, top=1, left=3, height=2, width=2)  # ink in rows 1-2, columns 3-4
    assert [int(m) for m in margins(image)] == [3, 1, 1, 3]  # left, right, top, bottom
    assert [int(m) for m in margins(torch.zeros(1, 1, 6, 6))] == [0, 0, 0, 0]

    def amount(before, after, fraction, forward):
        return int(margin_shift(torch.tensor([before]), torch.tensor([after]),
                                torch.tensor([fraction]), torch.tensor([forward])))

    # floor(-r x before) toward the start, floor(r x (1 + after)) toward the end
    assert [amount(3, 1, 0.5, False), amount(3, 1, 0.5, True)] == [-2, 1]
    assert [amount(1, 3, 0.5, False), amount(1, 3, 0.5, True)] == [-1, 2]
    assert [amount(3, 1, 0.9999, False), amount(3, 1, 0.9999, True)] == [-3, 1]  # to the edge
    assert [amount(3, 1, 0.1, False), amount(3, 1, 0.1, True)] == [-1, 0]


def test_roll_moves_rows_down_and_columns_right():
    image = blob(6, top=1, left=3, height=2, width=2)
    assert torch.equal(roll(image, torch.tensor([2]), torch.tensor([-3])),
                       blob(6, top=3, left=0, height=2, width=2))


def test_the_random_shift_keeps_all_ink_inside():
    g = torch.Generator().manual_seed(0)
    size, count = 10, 400
    sizes = torch.randint(1, 6, (count, 2), generator=g)
    images = torch.cat([blob(size, int(torch.randint(0, size - h + 1, (), generator=g)),
                             int(torch.randint(0, size - w + 1, (), generator=g)), int(h), int(w))
                        for h, w in sizes.tolist()])
    moved = random_margin_shift(images, torch.Generator().manual_seed(1))
    for before, after, (h, w) in zip(images, moved, sizes.tolist(), strict=True):
        left, right, top, bottom = (int(m) for m in margins(after[None]))
        assert (size - top - bottom, size - left - right) == (h, w)  # one piece, not wrapped
        assert after.sum() == before.sum()
    lefts = torch.stack([margins(x[None])[0] for x in moved]) - margins(images)[0]
    assert (lefts > 0).any() and (lefts < 0).any() and (lefts == 0).any()


# --- 3. squeeze ------------------------------------------------------------------------------


def lanczos3_reference(x: float) -> float:
    x = abs(x)
    if x > 3:
        return 0.0
    if x <= 1e-3:
        return 1.0
    return 3 * math.sin(math.pi * x) * math.sin(math.pi * x / 3) / (math.pi * x) ** 2


def tf_squeeze_reference(row: list[float], cut: int, extra: int) -> list[float]:
    """TensorFlow's resize of one row of W pixels to W - cut (antialiased Lanczos-3,
    scale_and_translate's spans: the sample point, the kernel widened by 1 / scale, the
    input pixels within its reach, weights normalised), padded to the left by cut // 2 +
    extra and cut to W."""
    size = len(row)
    out_size = size - cut
    inv_scale = size / out_size
    resized = []
    for j in range(out_size):
        sample = (j + 0.5) * inv_scale
        start = min(max(math.ceil(sample - 3 * inv_scale - 0.5), 0), size - 1)
        end = min(max(math.floor(sample + 3 * inv_scale - 0.5), 0), size - 1) + 1
        weights = [lanczos3_reference((s + 0.5 - sample) / inv_scale) for s in range(start, end)]
        total = sum(weights)
        resized.append(sum(w / total * row[s] for w, s in zip(weights, range(start, end),
                                                               strict=True)))
    placed = [0.0] * (cut // 2 + extra) + resized + [0.0] * size
    return placed[:size]


def test_a_squeezed_constant_is_the_constant_narrower_and_placed():
    ones = torch.ones(1, 1, 3, 8)
    for cut, extra, first, last in [(2, 0, 1, 6), (2, 1, 2, 7), (3, 0, 1, 5), (1, 1, 1, 7)]:
        row = squeeze(ones, torch.tensor([cut]), torch.tensor([extra]))[0, 0]
        inked = torch.zeros(8, dtype=torch.bool)
        inked[first:last + 1] = True
        torch.testing.assert_close(row[:, inked], torch.ones(3, last + 1 - first))
        assert torch.equal(row[:, ~inked], torch.zeros(3, 8 - (last + 1 - first)))


@pytest.mark.parametrize("cut, extra", [(1, 0), (3, 1), (7, 0), (7, 1)])
def test_the_squeeze_equals_tensorflows_lanczos_resize(cut, extra):
    image = torch.rand(1, 1, 2, 28, generator=torch.Generator().manual_seed(cut))
    out = squeeze(image, torch.tensor([cut]), torch.tensor([extra]))
    for r in range(2):
        expected = torch.tensor(tf_squeeze_reference(image[0, 0, r].tolist(), cut, extra))
        torch.testing.assert_close(out[0, 0, r], expected.float(), rtol=0, atol=1e-6)


def test_the_random_squeeze_takes_1_to_7_columns():
    ones = torch.ones(2000, 1, 2, 28)
    inked = (random_squeeze(ones, torch.Generator().manual_seed(0))[:, 0, 0].abs() > 1e-3)
    width = inked.sum(-1)  # 28 - cut
    assert width.min().item() == 21 and width.max().item() == 27
    first = inked.int().argmax(-1)  # cut // 2 + extra
    assert first.min().item() == 0 and first.max().item() == 4


# --- 4. erasing ------------------------------------------------------------------------------


def test_erase_zeroes_a_4x4_patch_by_hand():
    ones = torch.ones(1, 2, 28, 28)
    erased = erase(ones, torch.tensor([5]), torch.tensor([10]))
    expected = ones.clone()
    expected[..., 5:9, 10:14] = 0
    assert torch.equal(erased, expected)


def test_the_random_patch_is_4x4_zeros_from_row_and_column_4_to_22():
    ones = torch.ones(3000, 1, 28, 28)
    erased = random_erase(ones, torch.Generator().manual_seed(0))[:, 0]
    zero = erased == 0
    assert torch.equal(zero.sum(dim=(1, 2)), torch.full((3000,), 16))
    rows, cols = zero.any(2).int(), zero.any(1).int()
    top, left = rows.argmax(1), cols.argmax(1)
    assert torch.equal(rows.sum(1), torch.full((3000,), 4))  # 4 rows x 4 columns
    assert torch.equal(cols.sum(1), torch.full((3000,), 4))
    assert (top.min().item(), top.max().item(), left.min().item(), left.max().item()) == (
        4, 22, 4, 22)
    tiny = random_erase(torch.ones(1, 1, 8, 8), first=0, places=5)
    assert (tiny == 0).sum() == 16
    with pytest.raises(ValueError, match="does not fit"):
        random_erase(torch.ones(1, 1, 8, 8))


# --- the whole augmentation ------------------------------------------------------------------


def digits(count: int, channels: int = 1) -> torch.Tensor:
    """Float images (count, channels, 28, 28) with a digit-like stroke each."""
    images, _ = make_fake_digits(count, seed=3)
    x = to_model_input(torch.from_numpy(images))
    x = torch.where(x > 0.5, x, torch.zeros(()))  # clean margins around the bar
    return x.expand(-1, channels, -1, -1).contiguous()


def test_the_augmentation_is_determined_by_its_generator():
    x = digits(8)
    first = efficient_augment(x, torch.Generator().manual_seed(5))
    again = efficient_augment(x, torch.Generator().manual_seed(5))
    other = efficient_augment(x, torch.Generator().manual_seed(6))
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert first.shape == x.shape and first.dtype == x.dtype


def test_batch_size_one_and_channels_moving_together():
    one = efficient_augment(digits(1), torch.Generator().manual_seed(0))
    assert one.shape == (1, 1, 28, 28)
    three = efficient_augment(digits(4, channels=3), torch.Generator().manual_seed(0))
    assert torch.equal(three[:, 0], three[:, 1]) and torch.equal(three[:, 0], three[:, 2])


class Recorder(nn.Module):
    """A linear classifier that keeps every (images, labels) pair it is given."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(28 * 28, 10)
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> ModelOutput:
        self.seen.append((x.detach().clone(), y.clone()))
        return ModelOutput.from_logits(self.fc(x.flatten(1)))


def test_the_training_loop_pairs_each_augmented_image_with_its_own_label():
    images, labels = (torch.from_numpy(a) for a in make_fake_digits(10, seed=4))
    labels = labels.long()
    model = Recorder()
    order = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    options = StepOptions(batch_size=4, augment="efficient")
    train_one_epoch(model, torch.optim.Adam(model.parameters()), images, labels, order, options,
                    torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(7)
    for (x, y), idx in zip(model.seen, order.split(4), strict=True):
        assert torch.equal(y, labels[idx])
        assert torch.equal(x, efficient_augment(to_model_input(images[idx]), g))
    with pytest.raises(ValueError, match="do not combine"):
        StepOptions(augment="efficient", crop=24)


# --- runs through the command line -----------------------------------------------------------


@pytest.fixture(autouse=True)
def _work_in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def efficient_train(data_dir, out_dir, *extra: str) -> list[str]:
    return ["train", "--model", "efficient", "--no-download", "--data-dir", str(data_dir),
            "--no-progress", "--precision", "fp32", "--out-dir",
            str(out_dir), *extra]


def test_the_recipe_lands_in_the_runs_config(tiny_mnist_dir, tmp_path):
    """300 (fake) digits, one epoch of the paper preset under its authors' recipe."""
    out = tmp_path / "run"
    assert main(efficient_train(tiny_mnist_dir, out, "--subset", "300", "--val-size", "50",
                                "--epochs", "1")) == 0
    settings = json.loads((out / "config.json").read_text())["settings"]
    assert (settings["batch_size"], settings["lr"], settings["lr_decay"], settings["min_lr"],
            settings["schedule"], settings["augment"], settings["max_shift"]) == (
        16, 5e-4, 0.97, 5e-5, "exp", "efficient", 0)
    assert read_metrics(out)[0]["lr"] == 5e-4
    assert load_checkpoint(out / "last.pt")["scheduler"]["lr_lambdas"][0]["floor"] == 0.1


def test_a_resumed_run_equals_an_uninterrupted_one(tiny_mnist_dir, tmp_path):
    """The paper recipe (its augmentation, the floor reached in epoch 2) stopped after
    epoch 1 by its time limit and resumed: weights, schedule and losses as if never stopped."""
    common = ("--preset", "small", "--subset", "100", "--val-size", "50", "--epochs", "2",
              "--min-lr", "4.9e-4")
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(efficient_train(tiny_mnist_dir, full, *common)) == 0
    assert main(efficient_train(tiny_mnist_dir, part, *common, "--time-limit", "1e-9")) == 0
    assert json.loads((part / "results.json").read_text())["complete"] is False
    assert main(["train", "--resume", str(part), "--no-progress"]) == 0
    resumed, uninterrupted = (load_checkpoint(d / "last.pt") for d in (part, full))
    assert resumed["epoch"] == uninterrupted["epoch"] == 2
    for name, tensor in uninterrupted["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], tensor, rtol=0, atol=0)
    assert resumed["scheduler"] == uninterrupted["scheduler"]
    rows = [(r["lr"], r["train_loss"], r["val_accuracy"]) for r in read_metrics(full)]
    assert [(r["lr"], r["train_loss"], r["val_accuracy"]) for r in read_metrics(part)] == rows
    assert [lr for lr, _, _ in rows] == [5e-4, 4.9e-4]  # 5e-4 x 0.97 = 4.85e-4 < the floor
