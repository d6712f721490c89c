"""What the data decides about a model: how its input is normalised, CapsNet's Conv1
stride, and whether own images are prepared as MNIST's digits were."""
from __future__ import annotations

from capsnet.config import INPUT_NORMS, conv_output_size

# Datasets of handwritten digits, whose own images are made like MNIST's (not Fashion-MNIST).
DIGIT_DATASETS = ("mnist",)


def input_norm_for(dataset: str, requested: str = "auto") -> str:
    """The paper's raw pixels for digit datasets, per-image standardisation otherwise;
    ``requested`` other than 'auto' wins."""
    if requested != "auto":
        if requested not in INPUT_NORMS:
            raise ValueError(f"unknown input normalisation {requested!r}; choose from auto, "
                             f"{', '.join(INPUT_NORMS)}")
        return requested
    return "none" if dataset in DIGIT_DATASETS else "image"


# Conv1's stride for other data grows until the primary grid has at most this many times
# the paper's 6 x 6 cells (32x32 keeps stride 1, 48x48 takes 2, 64x64 takes 3).
MAX_PRIMARY_CELLS_FACTOR = 2
PAPER_IMAGE_SIZE = 28  # MNIST's side, where the paper's CapsNet has its 6 x 6 primary grid


def conv1_stride_for(config, dataset: str, requested: str | int = "auto") -> int:
    """Conv1's stride: the paper's for digit datasets, else the smallest whose primary grid
    has at most MAX_PRIMARY_CELLS_FACTOR times the paper's cells; ``requested`` wins."""
    if requested != "auto":
        stride = int(requested)
        if stride < 1:
            raise ValueError(f"conv1 stride must be at least 1, not {requested!r}")
        return stride
    if dataset in DIGIT_DATASETS:
        return config.conv1_stride
    most = MAX_PRIMARY_CELLS_FACTOR * _primary_grid(config, 1, PAPER_IMAGE_SIZE) ** 2
    stride = config.conv1_stride
    while (_primary_grid(config, stride) ** 2 > most
           and _primary_grid(config, stride + 1) >= 1):
        stride += 1
    return stride


def _primary_grid(config, conv1_stride: int, image_size: int | None = None) -> int:
    """Side of the primary grid at ``conv1_stride`` (on ``image_size`` images); < 1: none."""
    conv1 = conv_output_size(image_size or config.image_size, config.conv1_kernel, conv1_stride)
    return conv_output_size(conv1, config.primary_kernel, config.primary_stride)


def is_digit_model(config) -> bool:
    """True for a grey model trained on handwritten digits (own images made MNIST-like)."""
    return config.dataset in DIGIT_DATASETS and config.in_channels == 1
