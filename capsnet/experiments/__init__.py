"""Experiments beyond plain accuracy, built on the library: robustness to rotations and affine
maps, the paper's affNIST protocol and MultiMNIST. Each trains through the one epoch driver
(:mod:`capsnet.training.runner`) and evaluates with the library's functions."""

TEST_SEED = 0  # the protocols' test sets (placed, affine, pairs) are the same for every run
SEED_STRIDE = 1_000  # per-epoch generators of the protocols: seed * SEED_STRIDE + epoch
