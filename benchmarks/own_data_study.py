"""CapsNet against a plain small CNN on the own-data study sets, side by side: both trained
the same number of epochs (5) on the same images, validation-selected, tested once.

    python -m benchmarks.make_data study --out /tmp/study
    python -m benchmarks.own_data_study --study-dir /tmp/study --out-dir runs/study

capsnet: capsnet's defaults (each image standardised, Conv1's stride chosen by the image
size); capsnet-paper-pixels: the paper's raw pixels (`--input-norm none`, the "before"
column); capsnet-stride-1: Conv1 at stride 1 whatever the size; cnn-tiny: `--model cnn
--preset tiny` (two 5x5 convolutions with max-pooling, FC 64; Adam 1e-3) at batch 64.
Fashion-MNIST grey is read as IDX files (fashion-grey: its first 3,000 training images).
"""
from __future__ import annotations

import sys

from benchmarks import sweep
from benchmarks.sweep import Study, Variant

CNN_BATCH = 64  # the plain CNN's usual batch; CapsNet keeps its own default (128)
TARGET = 0.5  # validation accuracy timed: half way up, a threshold, not a result

STUDY = Study(
    name="own_data_study", doc=__doc__,
    variants={"capsnet": Variant(),
              "capsnet-paper-pixels": Variant(("--input-norm", "none")),
              "capsnet-stride-1": Variant(("--conv1-stride", "1")),
              "cnn-tiny": Variant(("--model", "cnn", "--preset", "tiny",
                                   "--batch-size", str(CNN_BATCH)))},
    default_variants=("capsnet", "cnn-tiny"),
    default_datasets=("fashion-colour", "mixed-20", "large-48", "fashion-grey", "textured"),
    targets=lambda dataset: (TARGET,), epochs=5, seed=0, variant_flag="--models")


def main(argv: list[str] | None = None) -> int:
    return sweep.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
