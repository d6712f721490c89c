"""What the data decides about a model: how its input is normalised, CapsNet's Conv1
stride, and whether own images are prepared as MNIST's digits were."""
from __future__ import annotations

from capsnet.config import INPUT_NORMS, conv_output_size

# Datasets of handwritten digits: own images are made like MNIST's (capsnet.preprocess).
# Fashion-MNIST is not one: its items are photographed objects, light on a dark ground,
# filling the frame; MNIST's crop-to-ink and 20x20 fit would change them, so they are only
# resized like any other dataset's.
DIGIT_DATASETS = ("mnist",)


def input_norm_for(dataset: str, requested: str = "auto") -> str:
    """The input normalisation of a CapsNet trained on ``dataset``: the paper's raw pixels
    for the digit datasets it was made for, each image standardised for every other data
    (dense grounds stall the paper's model at chance). ``requested`` other than 'auto' wins."""
    if requested != "auto":
        if requested not in INPUT_NORMS:
            raise ValueError(f"unknown input normalisation {requested!r}; choose from auto, "
                             f"{', '.join(INPUT_NORMS)}")
        return requested
    return "none" if dataset in DIGIT_DATASETS else "image"


# Conv1's stride for other data grows until the primary grid has at most this many times
# the paper's cells (6 x 6 = 36 at 28x28): 32x32 keeps stride 1 (8 x 8 = 64 cells), 48x48
# takes 2 (6 x 6), 64x64 takes 3 (6 x 6). At 48x48 and stride 1 the 16 x 16 grid's 8,192
# capsules saturate every class capsule in the first steps (loss 3.2, chance for 2 epochs).
MAX_PRIMARY_CELLS_FACTOR = 2
PAPER_IMAGE_SIZE = 28  # MNIST's side, where the paper's CapsNet has its 6 x 6 primary grid


def conv1_stride_for(config, dataset: str, requested: str | int = "auto") -> int:
    """Conv1's stride for a CapsNet like ``config`` trained on ``dataset``: the paper's 1
    for the digit datasets, else the smallest stride whose primary grid has at most
    MAX_PRIMARY_CELLS_FACTOR times the cells of the same kernels on a 28x28 image at stride
    1 (the paper's 36). ``config``: a capsnet.models.capsnet.CapsNetConfig. ``requested``
    other than 'auto' wins."""
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
    """Side of ``config``'s primary grid at Conv1 stride ``conv1_stride`` on its images (or
    on ``image_size`` ones); < 1: none."""
    conv1 = conv_output_size(image_size or config.image_size, config.conv1_kernel, conv1_stride)
    return conv_output_size(conv1, config.primary_kernel, config.primary_stride)


def is_digit_model(config) -> bool:
    """True for a grey model trained on handwritten digits (DIGIT_DATASETS), whose inputs
    are prepared as MNIST was made; every other model's inputs are plainly resized."""
    return config.dataset in DIGIT_DATASETS and config.in_channels == 1
