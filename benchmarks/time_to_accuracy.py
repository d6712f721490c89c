"""Time to accuracy: epochs and training minutes until the validation accuracy first reaches
99.0%, 99.4% and 99.5% on MNIST, for each training recipe, one seed each.

    python -m benchmarks.time_to_accuracy --data-dir ~/mnist --out-dir runs/tta

Each recipe trains in its own run directory (the paper recipe for 40 epochs, the protocol
run's, the fast one for its own; --epochs sets both); the sweep below says how runs resume
and how the table is read.
"""
from __future__ import annotations

import sys

from benchmarks import sweep
from benchmarks.sweep import Study, Variant
from capsnet.training.settings import RECIPES

THRESHOLDS = (0.990, 0.994, 0.995)
PAPER_EPOCHS = 40  # the protocol run's

STUDY = Study(
    name="time_to_accuracy", doc=__doc__,
    variants={name: Variant(("--recipe", name), epochs=PAPER_EPOCHS if name == "paper" else None)
              for name in RECIPES},
    default_variants=("paper", "fast"), default_datasets=("mnist",),
    targets=lambda dataset: THRESHOLDS, tiny_epochs=2, variant_flag="--recipes")


def main(argv: list[str] | None = None) -> int:
    return sweep.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
