"""How fast the EM model starts to learn: the `small` matrix-capsule model trained for a
few hundred steps on the first MNIST training images, under each of a list of variants,
then its validation accuracy on held-out training images.

    PYTHONPATH=. python3 benchmarks/em_early_learning.py --data-dir ~/mnist \
        --variants 3,3-unscaled,2,2-unscaled

A variant is the number of EM routing iterations, with the model's data-dependent
initialisation of the primary poses' scale (EMCapsNet.initialise_from_data) or, suffixed
'-unscaled', without it. Every variant starts from the same seed (the same initial
weights before the scaling) and sees the same images in the same order: steps x batch of
the first training images, Adam at the model's rate (3e-3), the spread loss with its margin
growing from 0.2 to 0.9 over the steps, the model compiled (--no-compile: eager), one
thread unless --threads says otherwise. Validation: the 2,000 training images from index
55,000 on (--val-start, --val-size; never trained on here). Prints one line per variant
and the table with the CPU's model; writes --out JSON when given. A probe of the first
minutes of training, not a measure of final accuracy.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from capsnet.data.augment import to_model_input  # noqa: E402
from capsnet.data.datasets import load_dataset  # noqa: E402
from capsnet.losses import spread_loss, spread_margin  # noqa: E402
from capsnet.models import (  # noqa: E402
    MODELS,  # noqa: E402
    build_model,
    make_config,
)
from capsnet.tuning.hardware import cpu_info  # noqa: E402

VALIDATION_START, VALIDATION_SIZE = 55_000, 2_000  # held out: beyond the trained images
EVAL_BATCH = 250
UNSCALED = "-unscaled"


def parse_variant(text: str) -> tuple[int, bool]:
    """'3' -> (3 iterations, scaled poses); '3-unscaled' -> (3, False)."""
    scaled = not text.endswith(UNSCALED)
    return int(text.removesuffix(UNSCALED)), scaled


def run_variant(variant: str, images: torch.Tensor, labels: torch.Tensor,
                args: argparse.Namespace) -> dict:
    iterations, scaled = parse_variant(variant)
    torch.manual_seed(args.seed)
    model = build_model(make_config("em", "small", routing_iterations=iterations))
    train_count = args.steps * args.batch_size
    val_start, val_size = args.val_start, args.val_size
    if train_count > val_start or val_start + val_size > len(images):
        raise SystemExit(f"{train_count} training images must end before the validation "
                         f"images {val_start}..{val_start + val_size - 1} of {len(images)}")
    if scaled:
        model.initialise_from_data(to_model_input(images[:args.init_images]))
    optimizer = torch.optim.Adam(model.parameters(), lr=MODELS["em"].lr)
    step_model = model if args.no_compile else torch.compile(model)
    start = time.perf_counter()
    for step in range(args.steps):
        batch = slice(step * args.batch_size, (step + 1) * args.batch_size)
        x, y = to_model_input(images[batch]), labels[batch]  # (B, 1, 28, 28), (B,)
        output = step_model(x, y)
        loss = spread_loss(output.lengths, y, spread_margin(step / args.steps))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    seconds = time.perf_counter() - start
    model.eval()
    correct = 0
    with torch.no_grad():
        for first in range(val_start, val_start + val_size, EVAL_BATCH):
            last = min(first + EVAL_BATCH, val_start + val_size)
            scores = model(to_model_input(images[first:last])).lengths
            correct += (scores.argmax(1) == labels[first:last]).sum().item()
    return {"variant": variant, "iterations": iterations, "scaled_poses": scaled,
            "steps": args.steps, "batch_size": args.batch_size,
            "val_accuracy": correct / val_size, "train_seconds": round(seconds, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", required=True, help="MNIST's IDX files")
    p.add_argument("--variants", default="3,3-unscaled,2,2-unscaled",
                   help="comma-separated: N (iterations) or N-unscaled")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--init-images", type=int, default=256,
                   help="images the pose scaling sees (the training run's count)")
    p.add_argument("--val-start", type=int, default=VALIDATION_START,
                   help="first validation image (index into the training set)")
    p.add_argument("--val-size", type=int, default=VALIDATION_SIZE)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    train, _ = load_dataset("mnist", args.data_dir, download=False)
    images, labels = train.images, train.labels  # (60000, 28, 28) uint8, (60000,)
    rows = []
    for variant in args.variants.split(","):
        row = run_variant(variant.strip(), images, labels, args)
        print(f"{row['variant']}: validation {row['val_accuracy']:.2%} after {row['steps']} "
              f"steps of {row['batch_size']} ({row['train_seconds']} s)", flush=True)
        rows.append(row)
    cpu_model, _ = cpu_info()
    print(f"\n{cpu_model}, {args.threads} thread(s), seed {args.seed}")
    print("| iterations | pose scaling | validation |\n| --- | --- | --- |")
    for row in rows:
        print(f"| {row['iterations']} | {'yes' if row['scaled_poses'] else 'no'} | "
              f"{row['val_accuracy']:.2%} |")
    if args.out:
        report = {"cpu": cpu_model, "threads": args.threads, "rows": rows}
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
