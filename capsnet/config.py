"""Model configurations: numbers only, one dataclass per model, every size derived from a
few numbers. A leaf: this module imports nothing from the package.

The number of primary capsules is never typed: it follows from the image size, the two
kernels and the stride (1152 = 32 types x 6 x 6 for a 28x28 input). The fields every
model shares (the input, the classes, the data it was trained on) are declared once, in
:class:`DataConfig`, and checked once. Presets, recipes and the registry that builds a
model from a config live with the models (:mod:`capsnet.models.registry`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

INPUT_NORMS = ("none", "image")  # capsnet.layers.input_norm


class ConfigError(ValueError):
    """An option a model does not have, or a combination it cannot honour (one line that
    names the valid choices): a usage error. A value out of range is a plain ValueError."""


def conv_output_size(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """Spatial size after a convolution (floor division, as in ``nn.Conv2d``)."""
    return (size + 2 * padding - kernel) // stride + 1


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
    # standardised; capsnet.layers.input_norm). Chosen by the data (capsnet.data.policy).
    input_norm: str = "none"


@dataclass(frozen=True)
class CapsNetConfig(NormalisedDataConfig):
    """The CapsNet of Sabour, Frosst & Hinton (2017), Figure 1 and 2.

    Defaults are the paper's; the ``small`` preset shrinks the widths for tests.
    """

    conv1_channels: int = 256
    conv1_kernel: int = 9
    # 1 in the paper; larger inputs of other data take a larger one (capsnet.data.policy.
    # conv1_stride_for) so that the primary capsules stay near the paper's count
    conv1_stride: int = 1
    primary_types: int = 32  # capsule types ("channels") in PrimaryCaps
    primary_dim: int = 8
    primary_kernel: int = 9
    primary_stride: int = 2
    digit_dim: int = 16
    # The routing algorithm from primary to digit capsules, by its registered name
    # (capsnet.layers.router.ROUTERS): 'dynamic' (the paper's Procedure 1),
    # 'inverted-attention' (Tsai et al. 2020) or 'self-attention'. Checked against the
    # registered routers when the model is made (capsnet.models.capsnet).
    routing: str = "dynamic"
    routing_iterations: int = 3
    routing_full_graph: bool = False  # backpropagate through every routing iteration
    # Section 7 (CIFAR-10): a "none-of-the-above" category in the routing softmax, a logit
    # fixed at zero that takes a share of each input capsule's coupling but has no capsule.
    none_of_the_above: bool = False
    decoder_hidden: tuple[int, ...] = (512, 1024)
    use_decoder: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.conv1_stride < 1:
            raise ValueError(f"conv1_stride must be at least 1, not {self.conv1_stride}")
        if self.primary_grid < 1:
            raise ValueError(
                f"image size {self.image_size} is too small for the conv kernels "
                f"{self.conv1_kernel} and {self.primary_kernel} (strides {self.conv1_stride} "
                f"and {self.primary_stride}): "
                f"the smallest workable size is {self.smallest_image_size} pixels "
                f"(--image-size N resizes the images)")
        if self.routing_iterations < 1:
            raise ValueError("routing_iterations must be at least 1")

    @property
    def smallest_image_size(self) -> int:
        """The smallest input side with a 1x1 primary grid: Conv1's kernel, then one
        PrimaryCaps kernel of Conv1 positions (17 for the paper's 9 and 9 at stride 1)."""
        return self.conv1_kernel + (self.primary_kernel - 1) * self.conv1_stride

    @property
    def conv1_grid(self) -> int:
        """Side of Conv1's output (20 for 28x28)."""
        return conv_output_size(self.image_size, self.conv1_kernel, self.conv1_stride)

    @property
    def primary_grid(self) -> int:
        """Side of PrimaryCaps' output grid (6 for 28x28)."""
        return conv_output_size(self.conv1_grid, self.primary_kernel, self.primary_stride)

    @property
    def num_primary_caps(self) -> int:
        """Number of primary capsules (1152 for 28x28)."""
        return self.primary_types * self.primary_grid**2


@dataclass(frozen=True)
class CNNConfig(DataConfig):
    """The paper's baseline CNN: three 5x5 conv layers, FC 328, FC 192, dropout.

    ``pool`` > 1 max-pools by that factor after every convolution (the paper's CNN has no
    pooling; the ``tiny`` preset, a plain small CNN, pools by 2)."""

    conv_channels: tuple[int, ...] = (256, 256, 128)
    conv_kernel: int = 5
    pool: int = 1
    fc_hidden: tuple[int, ...] = (328, 192)
    dropout: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.feature_grid < 1:
            raise ValueError(f"image size {self.image_size} is too small for "
                              f"{len(self.conv_channels)} poolings by {self.pool}")

    @property
    def feature_grid(self) -> int:
        """Side of the last convolution's output (the image's side without pooling)."""
        return self.image_size // self.pool ** len(self.conv_channels)


@dataclass(frozen=True)
class EfficientCapsNetConfig(DataConfig):
    """Efficient-CapsNet (Mazzia, Salvetti & Chiaberge 2021, Sci. Rep. 11:14634), the MNIST
    model of the public code (EscVM/Efficient-CapsNet, models/efficient_capsnet_graph_mnist.py):
    valid convolutions with ReLU and BatchNorm, a depthwise ``primary_kernel`` convolution
    cut into ``primary_dim``-D primary capsules, self-attention routing to ``digit_dim``-D
    class capsules, and the FC reconstruction decoder. 161,824 parameters without the
    decoder for 28x28 grey images (16 primary capsules, derived from the sizes)."""

    conv_channels: tuple[int, ...] = (32, 64, 64, 128)
    conv_kernels: tuple[int, ...] = (5, 3, 3, 3)
    conv_strides: tuple[int, ...] = (1, 1, 1, 2)
    primary_kernel: int = 9  # the depthwise convolution's kernel
    primary_dim: int = 8
    digit_dim: int = 16
    decoder_hidden: tuple[int, ...] = (512, 1024)
    use_decoder: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not len(self.conv_channels) == len(self.conv_kernels) == len(self.conv_strides):
            raise ValueError("conv_channels, conv_kernels and conv_strides differ in length")
        if self.conv_channels[-1] % self.primary_dim:
            raise ValueError(f"the last convolution's {self.conv_channels[-1]} channels do "
                              f"not make primary capsules of {self.primary_dim} dimensions")
        if self.primary_grid < 1:
            raise ValueError(f"image size {self.image_size} is too small for the convolutions "
                              f"{self.conv_kernels} (strides {self.conv_strides}) and the "
                              f"{self.primary_kernel}x{self.primary_kernel} depthwise kernel "
                              f"(--image-size N resizes the images)")

    @property
    def layers(self) -> tuple[tuple[int, int], ...]:
        """(kernel, stride) of every convolution and the depthwise one, input first."""
        return (*zip(self.conv_kernels, self.conv_strides, strict=True), (self.primary_kernel, 1))

    @property
    def feature_grid(self) -> int:
        """Side of the last convolution's output (9 for 28x28)."""
        size = self.image_size
        for kernel, stride in self.layers[:-1]:
            size = conv_output_size(size, kernel, stride)
        return size

    @property
    def primary_grid(self) -> int:
        """Side of the depthwise convolution's output (1 for 28x28)."""
        return conv_output_size(self.feature_grid, self.primary_kernel)

    @property
    def primary_types(self) -> int:
        """Primary capsules per grid cell (16: 128 channels of 8 dimensions each)."""
        return self.conv_channels[-1] // self.primary_dim

    @property
    def num_primary_caps(self) -> int:
        """Number of primary capsules (16 for 28x28: 128 channels of a 1x1 map, 8 each)."""
        return self.primary_grid**2 * self.primary_types


@dataclass(frozen=True)
class EMCapsNetConfig(NormalisedDataConfig):
    """The matrix-capsule network of Hinton, Sabour & Frosst (2018), section 4 (smallNORB):
    ReLU Conv1 (5x5, stride 2, A channels) -> PrimaryCaps (1x1, B types of 4x4 poses and
    sigmoid activations) -> ConvCaps1 (3x3, stride 2, C types) -> ConvCaps2 (3x3, stride 1,
    D types) -> one class capsule per class (transformations shared over positions,
    coordinate addition), EM routing between capsule layers, spread loss.

    Defaults are the paper's A = B = C = D = 32 with valid (unpadded) convolutions; on
    28x28 inputs the grids are 12, 12, 5 and 3. The ``small`` preset (A=64, B=8, C=D=16,
    as in IBM/matrix-capsules-with-em-routing config.py) trains on a CPU.
    """

    conv1_channels: int = 32  # A
    conv1_kernel: int = 5
    conv1_stride: int = 2
    primary_types: int = 32  # B
    caps1_types: int = 32  # C
    caps2_types: int = 32  # D
    caps_kernel: int = 3
    caps1_stride: int = 2
    caps2_stride: int = 1
    routing_iterations: int = 3
    final_lambda: float = 0.01  # the EM routing's last inverse temperature (authors, OpenReview)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.caps2_grid < 1:
            raise ValueError(f"image size {self.image_size} is too small for the EM capsule "
                              f"network's kernels and strides: the smallest workable size is "
                              f"{self.smallest_image_size} pixels (--image-size N resizes the "
                              f"images)")
        if self.routing_iterations < 1:
            raise ValueError("routing_iterations must be at least 1")

    @property
    def layers(self) -> tuple[tuple[int, int], ...]:
        """(kernel, stride) of Conv1, PrimaryCaps, ConvCaps1 and ConvCaps2, input first."""
        return ((self.conv1_kernel, self.conv1_stride), (1, 1),
                (self.caps_kernel, self.caps1_stride), (self.caps_kernel, self.caps2_stride))

    @property
    def conv1_grid(self) -> int:
        """Side of Conv1's output, also PrimaryCaps' grid (12 for 28x28)."""
        return conv_output_size(self.image_size, self.conv1_kernel, self.conv1_stride)

    @property
    def caps1_grid(self) -> int:
        """Side of ConvCaps1's grid (5 for 28x28)."""
        return conv_output_size(self.conv1_grid, self.caps_kernel, self.caps1_stride)

    @property
    def caps2_grid(self) -> int:
        """Side of ConvCaps2's grid, the class capsules' children (3 for 28x28)."""
        return conv_output_size(self.caps1_grid, self.caps_kernel, self.caps2_stride)

    @property
    def smallest_image_size(self) -> int:
        """The smallest input side with a 1x1 ConvCaps2 grid."""
        size = 1
        for kernel, stride in reversed(self.layers):
            size = (size - 1) * stride + kernel
        return size

    @property
    def class_coordinates(self) -> tuple[float, ...]:
        """Coordinate addition: the centre of the receptive field of each row (= column) of
        ConvCaps2's grid, in pixels, scaled by the image size to (0, 1)."""
        centres, _ = stack_fields(self.layers, self.caps2_grid)
        return tuple((centre + 0.5) / self.image_size for centre in centres)  # pixel centre


def stack_fields(layers, grid: int) -> tuple[list[float], int]:
    """Where the cells of the last of a stack of unpadded layers ((kernel, stride), input
    first) look in the input: the centre (input pixel coordinates, 0 = the first pixel's
    centre) of row/column g's receptive field for every g < ``grid``, and its side."""
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


def field_names(config_class) -> list[str]:
    """The options of a config class, in declaration order."""
    return [f.name for f in dataclasses.fields(config_class)]


def field_defaults(config_class) -> dict:
    """Every option of a config class with its default."""
    return {f.name: f.default for f in dataclasses.fields(config_class)}


def check_known(model: str, config_class, keys) -> None:
    """ConfigError naming the unknown keys and the valid ones, if any key is not an option."""
    known = field_names(config_class)
    unknown = sorted(set(keys) - set(known))
    if unknown:
        raise ConfigError(f"unknown option {', '.join(map(repr, unknown))} for {model}; "
                          f"choose from {', '.join(known)}")
