"""Capsule models against CNNs on the bigger study sets (docs/bigger-images.md), all trained
the same epochs at the same batch on the same images, validation-selected, tested once:

    python -m benchmarks.make_data study --out /tmp/study --sets translated-60 \\
        cluttered-60 fashion-colour-64 numbers-100
    python -m benchmarks.bigger_images --study-dir /tmp/study --out-dir runs/bigger-images \\
        --datasets translated-60,fashion-colour-64,cluttered-60 --epochs 3

capsnet-small: the paper's CapsNet (small widths), Conv1 strided by the image size;
capshead-conv: the paper's Conv1 (64 channels), PrimaryCaps, a strided convolutional capsule
layer, class capsules shared across positions; capshead: capsules on the small residual
stem; capshead-deep: the same with two convolutional capsule layers (three routed layers);
cnn-tiny: the project's small CNN; stemcnn: the small residual stem with a linear head.
Columns beyond the sweep's: parameters, and for capsule heads the share of capsules with
length > 0.1 on the test images, per routed layer (the deep-stack activity check).
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

import torch

from benchmarks import sweep
from benchmarks.sweep import Study, Variant
from capsnet.checkpoint import load_model
from capsnet.data.image_dataset import to_model_input
from capsnet.data.model_view import load_test_set
from capsnet.models import count_parameters

# The capsule heads without a decoder: the linear head has none (CapsNet keeps the paper's)
NO_DECODER = ("--reconstruction-weight", "0")
BATCH = 32  # every variant's: 3,000 images are ~84 steps an epoch
ACTIVE_LENGTH = 0.1  # a capsule counts as active above this length (activation)
EVALUATION_BATCH = 100


def variant(*options: str, note: str = "-") -> Variant:
    return Variant((*options, "--batch-size", str(BATCH)), note)


def data_dir_of(run_dir: Path) -> str | None:
    """The --data-dir of the run's `capsnet train` command."""
    words = shlex.split((run_dir / "command.txt").read_text().splitlines()[-1])
    return words[words.index("--data-dir") + 1] if "--data-dir" in words else None


@torch.no_grad()
def active_shares(model, images: torch.Tensor) -> list[float]:
    """Per routed layer of a capsule head, the share of capsules (over positions, types and
    test images) with activation above ACTIVE_LENGTH."""
    counts: list[float] = []
    for start in range(0, len(images), EVALUATION_BATCH):
        outputs = model.head.layer_outputs(model.features(images[start:start + EVALUATION_BATCH]))
        shares = [(a > ACTIVE_LENGTH).float().sum().item() for _, a in outputs[1:]]
        counts = shares if not counts else [c + s for c, s in zip(counts, shares, strict=True)]
    sizes = [a[0].numel() for _, a in model.head.layer_outputs(model.features(images[:1]))[1:]]
    return [c / (n * len(images)) for c, n in zip(counts, sizes, strict=True)]


def evaluate(run_dir: Path, row: dict, device: torch.device, measure: bool) -> dict | None:
    """Parameters of the selected model and, for capsule heads, active capsules per layer."""
    checkpoint = run_dir / "best.pt"
    if not checkpoint.is_file():
        return None
    model = load_model(checkpoint, device)
    active = None
    if hasattr(model, "head") and measure:
        test = load_test_set(model.config, "folder", data_dir_of(run_dir), progress=False)
        active = active_shares(model, to_model_input(test.images).to(device))
    return {"parameters": count_parameters(model), "active": active}


STUDY = Study(
    name="bigger_images", doc=__doc__,
    variants={"capsnet-small": variant("--model", "capsnet", "--preset", "small"),
              "capshead-conv": variant("--model", "capshead", "--preset", "conv", *NO_DECODER),
              "capshead": variant("--model", "capshead", *NO_DECODER),
              "capshead-deep": variant("--model", "capshead", "--preset", "deep", *NO_DECODER),
              "cnn-tiny": variant("--model", "cnn", "--preset", "tiny"),
              "stemcnn": variant("--model", "stemcnn")},
    default_variants=("capsnet-small", "capshead-conv", "capshead", "cnn-tiny", "stemcnn"),
    default_datasets=("translated-60", "fashion-colour-64", "cluttered-60"),
    targets=lambda dataset: (0.5,), epochs=3, seed=0, variant_flag="--models", evaluate=evaluate,
    columns=lambda dataset: [
        ("parameters", lambda r: "-" if not r.get("eval") else f"{r['eval']['parameters']:,}"),
        ("active capsules per routed layer", lambda r: "-" if not r.get("eval") or
         r["eval"]["active"] is None else ", ".join(f"{100 * a:.0f}%"
                                                    for a in r["eval"]["active"]))])


def main(argv: list[str] | None = None) -> int:
    return sweep.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
