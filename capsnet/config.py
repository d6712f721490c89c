"""What every model config shares, and its classes by name; a leaf that imports nothing from
the package. The common fields live once in :class:`DataConfig`; each model's config
subclasses it in its own file and derives every size from a few numbers."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

INPUT_NORMS = ("none", "image")  # capsnet.layers.InputNorm


class ConfigError(ValueError):
    """An option a model does not have, or a combination it cannot honour (names the choices)."""


def conv_output_size(size: int, kernel: int, stride: int = 1) -> int:
    """Spatial size after an unpadded convolution (floor division, as in ``nn.Conv2d``)."""
    return (size - kernel) // stride + 1


@dataclass(frozen=True)
class DataConfig:
    """What every model is told about its input and classes."""

    image_size: int = 28
    in_channels: int = 1
    num_classes: int = 10
    dataset: str = "mnist"  # what the model was trained on (decides how own images are prepared)
    class_names: tuple[str, ...] = ()  # the classes' names, index order; () = "0", "1", ...
    uncropped_size: int | None = None  # trained on crops: the side of the images cut from

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):  # lists (e.g. from JSON) become tuples: hashable
            if isinstance(getattr(self, field.name), list):
                object.__setattr__(self, field.name, tuple(getattr(self, field.name)))
        if self.class_names and len(self.class_names) != self.num_classes:
            raise ValueError(f"{len(self.class_names)} class names for {self.num_classes} "
                              f"classes")
        if self.uncropped_size is not None and self.uncropped_size < self.image_size:
            raise ValueError(f"uncropped_size {self.uncropped_size} is smaller than the "
                              f"{self.image_size}x{self.image_size} crops")
        if self.input_norm not in INPUT_NORMS:
            raise ValueError(f"unknown input_norm {self.input_norm!r}; choose from "
                              f"{', '.join(INPUT_NORMS)}")

    @property
    def input_norm(self) -> str:
        """How images meet the first layer; models without the option take them as they are."""
        return "none"

    @property
    def num_pixels(self) -> int:
        """Pixels a decoder reconstructs (784 for 28x28 grey)."""
        return self.in_channels * self.image_size**2


@dataclass(frozen=True)
class NormalisedDataConfig(DataConfig):
    """A model that can standardise its input images."""

    # How images meet Conv1: 'none' (the paper's pixels in [0, 1]) or 'image' (each image
    # standardised; capsnet.layers.InputNorm). Chosen by the data (capsnet.data.model_view).
    input_norm: str = "none"


def stack_fields(layers, grid: int) -> tuple[list[float], int]:
    """Receptive fields of the last of a stack of unpadded (kernel, stride) layers: the centre
    of row/column g's field in input pixels for every g < ``grid``, and its side."""
    centres = []
    for g in range(grid):
        centre = float(g)
        for kernel, stride in reversed(layers):
            centre = centre * stride + (kernel - 1) / 2  # in the layer's input
        centres.append(centre)
    side = 1
    for kernel, stride in reversed(layers):
        side = (side - 1) * stride + kernel
    return centres, side


def config_to_dict(config) -> dict:
    """Plain dict (JSON-serialisable) of a config."""
    return dataclasses.asdict(config)
