"""The paper's affNIST protocol (Sabour et al. 2017, section 5.2): train on MNIST digits
placed at random positions on a 40x40 black background, then test on affine-transformed
40x40 digits, comparing CapsNet and the CNN at the same accuracy on (expanded) MNIST.

The affine test set is made here from the MNIST test digits with affNIST's ranges
(:class:`capsnet.transforms.AffineRanges`), seeded, so it needs no download; it is in the
spirit of affNIST, not the affNIST files themselves.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from capsnet.data.splits import epoch_order
from capsnet.devices import pick_device
from capsnet.experiment import describe_run, run_epochs, write_results
from capsnet.models import count_parameters
from capsnet.robustness import NamedModel
from capsnet.training.checkpoint import model_from_checkpoint
from capsnet.training.fit import build_for, prepare_data
from capsnet.training.loop import StepOptions, evaluate, train_one_epoch
from capsnet.training.settings import TrainSettings
from capsnet.tuning import apply_plan, choose_plan
from capsnet.transforms import AffineRanges, affine_set, place_on_canvas

CANVAS = 40  # affNIST's image size
TEST_SEED = 0  # the placed-MNIST and affine test sets are the same for every run
SEED_STRIDE = 1_000  # epoch generators are seeded with seed * SEED_STRIDE + epoch


def placed(images: torch.Tensor, canvas: int, seed: int) -> torch.Tensor:
    """``images`` (N, 28, 28) at seeded random positions on a black canvas (N, canvas, canvas),
    drawn on the CPU so that a seed gives the same positions on every device."""
    g = torch.Generator().manual_seed(seed)
    return place_on_canvas(images.cpu(), canvas, g).to(images.device)


def evaluation_sets(images: torch.Tensor, canvas: int = CANVAS, seed: int = TEST_SEED,
              ranges: AffineRanges = AffineRanges()) -> dict[str, torch.Tensor]:
    """The two test sets of the protocol, each (N, canvas, canvas) uint8: 'mnist' (the test
    digits at random positions, the paper's 'expanded MNIST') and 'affine' (each digit
    transformed by a random affine map on the canvas, as in affNIST)."""
    return {"mnist": placed(images, canvas, seed),
            "affine": affine_set(images, ranges, seed, out_size=canvas)}


def compare(models: Sequence[NamedModel], images: torch.Tensor, labels: torch.Tensor,
            seed: int = TEST_SEED, ranges: AffineRanges = AffineRanges(),
            batch_size: int = 500) -> list[dict]:
    """A row per model: its accuracy on the placed MNIST test digits and on the affine set.
    Every model must take the same square input size (the canvas)."""
    sizes = {m.image_size for m in models}
    if len(sizes) != 1:
        raise ValueError(f"the models take different input sizes {sorted(sizes)}; the affNIST "
                         f"comparison needs one canvas")
    canvas = sizes.pop()
    if canvas <= images.shape[-1]:
        raise ValueError(f"the models take {canvas}x{canvas} images: train them on a larger "
                         f"canvas with `capsnet affnist train` (default {CANVAS})")
    sets = evaluation_sets(images, canvas, seed, ranges)
    rows = []
    for m in models:
        acc = {name: evaluate(m.model, x, labels, batch_size=batch_size).accuracy
               for name, x in sets.items()}
        rows.append({"model": m.label, "parameters": count_parameters(m.model), "canvas": canvas,
                     "images": len(labels), "mnist_accuracy": acc["mnist"],
                     "affine_accuracy": acc["affine"]})
    return rows


def format_comparison(rows: Sequence[dict]) -> str:
    width = max([len(r["model"]) for r in rows] + [len("model")])
    lines = [f"{'model':<{width}} {'parameters':>10} {'MNIST (placed)':>14} {'affine':>8}"]
    lines += [f"{r['model']:<{width}} {r['parameters']:>10,} {100 * r['mnist_accuracy']:>13.2f}% "
              f"{100 * r['affine_accuracy']:>7.2f}%" for r in rows]
    return "\n".join(lines)


def train_affnist(settings: TrainSettings, canvas: int = CANVAS,
                  target_accuracy: Optional[float] = None, test_limit: Optional[int] = None,
                  argv: Optional[list[str]] = None, log: Callable[[str], None] = print) -> dict:
    """Train ``settings.model`` on MNIST digits placed at fresh random positions on a
    ``canvas`` background every epoch (no other augmentation), select by the accuracy on
    held-out digits placed the same way (stopping at ``target_accuracy`` if given), then
    test the selected model on both test sets (their first ``test_limit`` digits if given).
    Returns (and writes) results.json."""
    if settings.val_size < 1:
        raise ValueError("affNIST training needs held-out validation digits (val_size > 0)")
    device = pick_device(settings.device)
    torch.manual_seed(settings.seed)
    run_dir = Path(settings.out_dir)
    data = prepare_data(settings, device)
    images, labels = data.train.images[data.train_idx], data.train.labels[data.train_idx]
    val_images = placed(data.train.images[data.val_idx], canvas, settings.seed)
    val_labels = data.train.labels[data.val_idx]
    model, optimizer, scheduler = build_for(settings, data, device, image_size=canvas)
    saved = {**settings.to_dict(), "protocol": "affnist", "canvas": canvas,
             "target_accuracy": target_accuracy, "test_limit": test_limit}
    describe_run(run_dir, saved, model, argv)
    plan = choose_plan(model, device, settings.batch_size, precision=settings.precision,
                       conv_impl=settings.conv_impl)
    apply_plan(model, plan)
    log(f"speed: {plan.describe()}")
    options = StepOptions(settings.batch_size, 0, settings.reconstruction_weight)
    log(f"affNIST protocol: {settings.model} on {len(images)} MNIST digits at random places on "
        f"a {canvas}x{canvas} canvas, {len(val_labels)} validation digits; device {device}")

    def train_epoch(epoch: int) -> dict:
        x = placed(images, canvas, settings.seed * SEED_STRIDE + epoch)  # (M, 40, 40)
        order = epoch_order(len(labels), settings.seed, epoch, device)
        result = train_one_epoch(model, optimizer, x, labels, order, options)
        return {"train_loss": result["loss"], "train_accuracy": result["accuracy"]}

    def validate() -> float:
        return evaluate(model, val_images, val_labels,
                        reconstruction_weight=settings.reconstruction_weight).accuracy

    state = run_epochs(run_dir, model, optimizer, scheduler, settings.epochs, train_epoch,
                       validate, saved, target_accuracy, log)
    best = NamedModel(settings.model, model_from_checkpoint(run_dir / "best.pt", device))
    count = len(data.test.labels) if test_limit is None else min(test_limit,
                                                                 len(data.test.labels))
    row = compare([best], data.test.images[:count], data.test.labels[:count])[0]
    log(f"test: {100 * row['mnist_accuracy']:.2f}% on placed MNIST, "
        f"{100 * row['affine_accuracy']:.2f}% on the affine set "
        f"(validation-selected epoch {state['best_epoch']})")
    results = {**state, "test": row, "test_seed": TEST_SEED}
    write_results(run_dir, results)
    return results
