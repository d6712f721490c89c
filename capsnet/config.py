"""Model configurations: one dataclass per model, every size derived from a few numbers.

The number of primary capsules is never typed: it follows from the image size, the two
kernels and the stride (1152 = 32 types x 6 x 6 for a 28x28 input).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """Spatial size after a convolution (floor division, as in ``nn.Conv2d``)."""
    return (size + 2 * padding - kernel) // stride + 1


@dataclass(frozen=True)
class CapsNetConfig:
    """The CapsNet of Sabour, Frosst & Hinton (2017), Figure 1 and 2.

    Defaults are the paper's; the ``small`` preset shrinks the widths for tests.
    """

    image_size: int = 28
    in_channels: int = 1
    num_classes: int = 10
    conv1_channels: int = 256
    conv1_kernel: int = 9
    primary_types: int = 32  # capsule types ("channels") in PrimaryCaps
    primary_dim: int = 8
    primary_kernel: int = 9
    primary_stride: int = 2
    digit_dim: int = 16
    routing_iterations: int = 3
    routing_full_graph: bool = False  # backpropagate through every routing iteration
    decoder_hidden: tuple[int, ...] = (512, 1024)
    use_decoder: bool = True

    def __post_init__(self) -> None:
        if self.primary_grid < 1:
            raise ValueError(
                f"image_size {self.image_size} is too small for conv kernels "
                f"{self.conv1_kernel} and {self.primary_kernel} (stride {self.primary_stride})"
            )
        if self.routing_iterations < 1:
            raise ValueError("routing_iterations must be at least 1")
        object.__setattr__(self, "decoder_hidden", tuple(self.decoder_hidden))

    @property
    def conv1_grid(self) -> int:
        """Side of Conv1's output (20 for 28x28)."""
        return conv_output_size(self.image_size, self.conv1_kernel)

    @property
    def primary_grid(self) -> int:
        """Side of PrimaryCaps' output grid (6 for 28x28)."""
        return conv_output_size(self.conv1_grid, self.primary_kernel, self.primary_stride)

    @property
    def num_primary_caps(self) -> int:
        """Number of primary capsules (1152 for 28x28)."""
        return self.primary_types * self.primary_grid**2

    @property
    def num_pixels(self) -> int:
        """Pixels the decoder reconstructs (784 for 28x28 grey)."""
        return self.in_channels * self.image_size**2


@dataclass(frozen=True)
class CNNConfig:
    """The paper's baseline CNN: three 5x5 conv layers, FC 328, FC 192, dropout."""

    image_size: int = 28
    in_channels: int = 1
    num_classes: int = 10
    conv_channels: tuple[int, ...] = (256, 256, 128)
    conv_kernel: int = 5
    fc_hidden: tuple[int, ...] = (328, 192)
    dropout: float = 0.5

    def __post_init__(self) -> None:
        object.__setattr__(self, "conv_channels", tuple(self.conv_channels))
        object.__setattr__(self, "fc_hidden", tuple(self.fc_hidden))


MODEL_CONFIGS = {"capsnet": CapsNetConfig, "cnn": CNNConfig}

PRESETS: dict[str, dict[str, dict]] = {
    # The paper's sizes.
    "paper": {"capsnet": {}, "cnn": {}},
    # Narrow layers with the paper's structure: seconds per epoch on a CPU, for tests.
    "small": {
        "capsnet": {"conv1_channels": 32, "primary_types": 8, "decoder_hidden": (64, 128)},
        "cnn": {"conv_channels": (16, 16, 8), "fc_hidden": (32, 24)},
    },
}


def make_config(model: str, preset: str = "paper", **overrides):
    """Config for ``model`` ('capsnet' or 'cnn') from a named preset plus overrides."""
    if model not in MODEL_CONFIGS:
        raise ValueError(f"unknown model {model!r}; choose from {sorted(MODEL_CONFIGS)}")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    cls = MODEL_CONFIGS[model]
    known = {f.name for f in dataclasses.fields(cls)}
    values = {**PRESETS[preset][model], **{k: v for k, v in overrides.items() if k in known}}
    return cls(**values)


def config_to_dict(config) -> dict:
    """Plain dict (JSON-serialisable) of a config, with its model name."""
    return dataclasses.asdict(config)


def config_from_dict(model: str, values: dict):
    """Inverse of :func:`config_to_dict`; unknown keys are an error."""
    cls = MODEL_CONFIGS[model]
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"unknown {model} config keys: {sorted(unknown)}")
    return cls(**values)
