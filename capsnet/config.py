"""Model configurations: one dataclass per model, every size derived from a few numbers.

The number of primary capsules is never typed: it follows from the image size, the two
kernels and the stride (1152 = 32 types x 6 x 6 for a 28x28 input).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

INPUT_NORMS = ("none", "image")  # capsnet.layers.input_norm


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
    # 1 in the paper; larger inputs of other data take a larger one (conv1_stride_for) so
    # that the primary capsules stay near the paper's count
    conv1_stride: int = 1
    primary_types: int = 32  # capsule types ("channels") in PrimaryCaps
    primary_dim: int = 8
    primary_kernel: int = 9
    primary_stride: int = 2
    digit_dim: int = 16
    # The routing algorithm from primary to digit capsules, by its registered name
    # (capsnet.layers.router.ROUTERS): 'dynamic' (the paper's Procedure 1) or
    # 'inverted-attention' (Tsai et al. 2020). Checkpoints without the field are 'dynamic'.
    routing: str = "dynamic"
    routing_iterations: int = 3
    routing_full_graph: bool = False  # backpropagate through every routing iteration
    # Section 7 (CIFAR-10): a "none-of-the-above" category in the routing softmax, a logit
    # fixed at zero that takes a share of each input capsule's coupling but has no capsule.
    none_of_the_above: bool = False
    decoder_hidden: tuple[int, ...] = (512, 1024)
    use_decoder: bool = True
    dataset: str = "mnist"  # what the model was trained on (decides how own images are prepared)
    class_names: tuple[str, ...] = ()  # the classes' names, index order; () = "0", "1", ...
    uncropped_size: int | None = None  # trained on crops: the side of the images cut from
    # How images meet Conv1: 'none' (the paper's pixels in [0, 1]) or 'image' (each image
    # standardised; capsnet.layers.input_norm). Chosen by the data: input_norm_for().
    input_norm: str = "none"

    def __post_init__(self) -> None:
        if self.input_norm not in INPUT_NORMS:
            raise ValueError(f"unknown input_norm {self.input_norm!r}; choose from "
                             f"{', '.join(INPUT_NORMS)}")
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
        from capsnet.layers import capsnet_routers  # here: the layers import this module

        if self.routing not in capsnet_routers():
            raise ValueError(f"unknown routing {self.routing!r} for CapsNet; choose from "
                             f"{', '.join(capsnet_routers())}")
        _freeze_tuples(self, "decoder_hidden", "class_names")
        _check_data_fields(self)

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

    @property
    def num_pixels(self) -> int:
        """Pixels the decoder reconstructs (784 for 28x28 grey)."""
        return self.in_channels * self.image_size**2


CNN_DECODERS = ("none", "plain", "class-conditional")


@dataclass(frozen=True)
class CNNConfig:
    """The paper's baseline CNN: three 5x5 conv layers, FC 328, FC 192, dropout.

    ``pool`` > 1 max-pools by that factor after every convolution (the paper's CNN has no
    pooling; the ``tiny`` preset, a plain small CNN, pools by 2)."""

    image_size: int = 28
    in_channels: int = 1
    num_classes: int = 10
    conv_channels: tuple[int, ...] = (256, 256, 128)
    conv_kernel: int = 5
    pool: int = 1
    fc_hidden: tuple[int, ...] = (328, 192)
    dropout: float = 0.5
    dataset: str = "mnist"  # what the model was trained on (decides how own images are prepared)
    class_names: tuple[str, ...] = ()  # the classes' names, index order; () = "0", "1", ...
    uncropped_size: int | None = None  # trained on crops: the side of the images cut from
    # A reconstruction decoder fed the last hidden layer (Qin et al. 2020): "none", "plain"
    # (CNN+R) or "class-conditional" (CNN+CR: the features in the predicted class's slot).
    decoder: str = "none"
    decoder_hidden: tuple[int, ...] = (512, 1024)

    def __post_init__(self) -> None:
        _freeze_tuples(self, "conv_channels", "fc_hidden", "class_names", "decoder_hidden")
        _check_data_fields(self)
        if self.decoder not in CNN_DECODERS:
            raise ValueError(f"unknown CNN decoder {self.decoder!r}; choose from "
                             f"{', '.join(CNN_DECODERS)}")
        if self.feature_grid < 1:
            raise ValueError(f"image size {self.image_size} is too small for "
                             f"{len(self.conv_channels)} poolings by {self.pool}")

    @property
    def feature_grid(self) -> int:
        """Side of the last convolution's output (the image's side without pooling)."""
        return self.image_size // self.pool ** len(self.conv_channels)


@dataclass(frozen=True)
class EfficientCapsNetConfig:
    """Efficient-CapsNet (Mazzia, Salvetti & Chiaberge 2021, Sci. Rep. 11:14634), the MNIST
    model of the public code (EscVM/Efficient-CapsNet, models/efficient_capsnet_graph_mnist.py):
    valid convolutions with ReLU and BatchNorm, a depthwise ``primary_kernel`` convolution
    cut into ``primary_dim``-D primary capsules, self-attention routing to ``digit_dim``-D
    class capsules, and the FC reconstruction decoder. 161,824 parameters without the
    decoder for 28x28 grey images (16 primary capsules, derived from the sizes)."""

    image_size: int = 28
    in_channels: int = 1
    num_classes: int = 10
    conv_channels: tuple[int, ...] = (32, 64, 64, 128)
    conv_kernels: tuple[int, ...] = (5, 3, 3, 3)
    conv_strides: tuple[int, ...] = (1, 1, 1, 2)
    primary_kernel: int = 9  # the depthwise convolution's kernel
    primary_dim: int = 8
    digit_dim: int = 16
    decoder_hidden: tuple[int, ...] = (512, 1024)
    use_decoder: bool = True
    dataset: str = "mnist"  # what the model was trained on (decides how own images are prepared)
    class_names: tuple[str, ...] = ()  # the classes' names, index order; () = "0", "1", ...
    uncropped_size: int | None = None  # trained on crops: the side of the images cut from

    def __post_init__(self) -> None:
        _freeze_tuples(self, "conv_channels", "conv_kernels", "conv_strides", "decoder_hidden",
                       "class_names")
        _check_data_fields(self)
        if not len(self.conv_channels) == len(self.conv_kernels) == len(self.conv_strides):
            raise ValueError("conv_channels, conv_kernels and conv_strides differ in length")
        if self.conv_channels[-1] % self.primary_dim:
            raise ValueError(f"the last convolution's {self.conv_channels[-1]} channels do not "
                             f"make primary capsules of {self.primary_dim} dimensions")
        if self.primary_grid < 1:
            raise ValueError(f"image size {self.image_size} is too small for the convolutions "
                             f"{self.conv_kernels} (strides {self.conv_strides}) and the "
                             f"{self.primary_kernel}x{self.primary_kernel} depthwise kernel "
                             f"(--image-size N resizes the images)")

    @property
    def feature_grid(self) -> int:
        """Side of the last convolution's output (9 for 28x28)."""
        size = self.image_size
        for kernel, stride in zip(self.conv_kernels, self.conv_strides, strict=True):
            size = conv_output_size(size, kernel, stride)
        return size

    @property
    def primary_grid(self) -> int:
        """Side of the depthwise convolution's output (1 for 28x28)."""
        return conv_output_size(self.feature_grid, self.primary_kernel)

    @property
    def num_primary_caps(self) -> int:
        """Number of primary capsules (16 for 28x28: 128 channels of a 1x1 map, 8 each)."""
        return self.primary_grid**2 * self.conv_channels[-1] // self.primary_dim

    @property
    def num_pixels(self) -> int:
        """Pixels the decoder reconstructs (784 for 28x28 grey)."""
        return self.in_channels * self.image_size**2


@dataclass(frozen=True)
class EMCapsNetConfig:
    """The matrix-capsule network of Hinton, Sabour & Frosst (2018), section 4 (smallNORB):
    ReLU Conv1 (5x5, stride 2, A channels) -> PrimaryCaps (1x1, B types of 4x4 poses and
    sigmoid activations) -> ConvCaps1 (3x3, stride 2, C types) -> ConvCaps2 (3x3, stride 1,
    D types) -> one class capsule per class (transformations shared over positions,
    coordinate addition), EM routing between capsule layers, spread loss.

    Defaults are the paper's A = B = C = D = 32 with valid (unpadded) convolutions; on
    28x28 inputs the grids are 12, 12, 5 and 3. The ``small`` preset (A=64, B=8, C=D=16,
    as in IBM/matrix-capsules-with-em-routing config.py) trains on a CPU.
    """

    image_size: int = 28
    in_channels: int = 1
    num_classes: int = 10
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
    dataset: str = "mnist"  # what the model was trained on (decides how own images are prepared)
    class_names: tuple[str, ...] = ()  # the classes' names, index order; () = "0", "1", ...
    uncropped_size: int | None = None  # trained on crops: the side of the images cut from
    input_norm: str = "none"  # how images meet Conv1, as CapsNetConfig.input_norm

    def __post_init__(self) -> None:
        if self.input_norm not in INPUT_NORMS:
            raise ValueError(f"unknown input_norm {self.input_norm!r}; choose from "
                             f"{', '.join(INPUT_NORMS)}")
        if self.caps2_grid < 1:
            raise ValueError(f"image size {self.image_size} is too small for the EM capsule "
                             f"network's kernels and strides: the smallest workable size is "
                             f"{self.smallest_image_size} pixels (--image-size N resizes the "
                             f"images)")
        if self.routing_iterations < 1:
            raise ValueError("routing_iterations must be at least 1")
        _freeze_tuples(self, "class_names")
        _check_data_fields(self)

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
        centres = []
        for p in range(self.caps2_grid):
            centre = float(p)
            for kernel, stride in reversed(self.layers):
                centre = centre * stride + (kernel - 1) / 2  # in the layer's input grid
            centres.append((centre + 0.5) / self.image_size)  # pixel centre, scaled
        return tuple(centres)


def _freeze_tuples(config, *names: str) -> None:
    """Lists given for tuple fields (e.g. from JSON) become tuples: the config stays hashable."""
    for name in names:
        object.__setattr__(config, name, tuple(getattr(config, name)))


def _check_data_fields(config) -> None:
    if config.class_names and len(config.class_names) != config.num_classes:
        raise ValueError(f"{len(config.class_names)} class names for {config.num_classes} "
                         f"classes")
    if config.uncropped_size is not None and config.uncropped_size < config.image_size:
        raise ValueError(f"uncropped_size {config.uncropped_size} is smaller than the "
                         f"{config.image_size}x{config.image_size} crops")


def class_names(config) -> list[str]:
    """The classes' names in index order: the config's, else "0", "1", ..."""
    return list(config.class_names) or [str(i) for i in range(config.num_classes)]


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


def conv1_stride_for(config: CapsNetConfig, dataset: str, requested: str | int = "auto") -> int:
    """Conv1's stride for a CapsNet like ``config`` trained on ``dataset``: the paper's 1
    for the digit datasets, else the smallest stride whose primary grid has at most
    MAX_PRIMARY_CELLS_FACTOR times the paper model's cells. ``requested`` other than
    'auto' wins."""
    if requested != "auto":
        stride = int(requested)
        if stride < 1:
            raise ValueError(f"conv1 stride must be at least 1, not {requested!r}")
        return stride
    if dataset in DIGIT_DATASETS:
        return config.conv1_stride
    most = MAX_PRIMARY_CELLS_FACTOR * CapsNetConfig().primary_grid ** 2
    stride = config.conv1_stride
    while _primary_grid(config, stride) ** 2 > most and _primary_grid(config, stride + 1) >= 1:
        stride += 1
    return stride


def _primary_grid(config: CapsNetConfig, conv1_stride: int) -> int:
    """Side of ``config``'s primary grid at Conv1 stride ``conv1_stride`` (< 1: none)."""
    conv1 = conv_output_size(config.image_size, config.conv1_kernel, conv1_stride)
    return conv_output_size(conv1, config.primary_kernel, config.primary_stride)


def is_digit_model(config) -> bool:
    """True for a grey model trained on handwritten digits (DIGIT_DATASETS), whose inputs
    are prepared as MNIST was made; every other model's inputs are plainly resized."""
    return config.dataset in DIGIT_DATASETS and config.in_channels == 1


def label_of(config, index: int) -> str:
    """How class ``index`` is named in text: "7" for digits named by their index, else the
    name with the index, "Sneaker (7)"."""
    return indexed_name(class_names(config), index)


def indexed_name(names: Sequence[str], index: int) -> str:
    """names[index], followed by " (index)" unless the name is the index itself."""
    name = names[index]
    return name if name == str(index) else f"{name} ({index})"


def class_index(config, text: str) -> int:
    """A class named on the command line, by index ("7") or by name ("Sneaker"), -> its
    index; ValueError naming the classes when there is no such class."""
    names = class_names(config)
    if text in names:
        return names.index(text)
    if text.lstrip("-").isdigit() and 0 <= int(text) < len(names):
        return int(text)
    named = any(name != str(j) for j, name in enumerate(names))
    listed = f" ({', '.join(f'{j}={n}' for j, n in enumerate(names))})" if named else ""
    raise ValueError(f"no class {text!r}: the model's classes are 0..{len(names) - 1}{listed}")


MODEL_CONFIGS = {"capsnet": CapsNetConfig, "cnn": CNNConfig,
                 "efficient": EfficientCapsNetConfig, "em": EMCapsNetConfig}

PRESETS: dict[str, dict[str, dict]] = {
    # The paper's sizes.
    "paper": {"capsnet": {}, "cnn": {}, "efficient": {}, "em": {}},
    # Narrow layers with the paper's structure: seconds per epoch on a CPU, for tests.
    "small": {
        "capsnet": {"conv1_channels": 32, "primary_types": 8, "decoder_hidden": (64, 128)},
        "cnn": {"conv_channels": (16, 16, 8), "fc_hidden": (32, 24)},
        "efficient": {"conv_channels": (16, 32, 32, 64), "decoder_hidden": (64, 128)},
        # EM: A=64, B=8, C=D=16, the sizes of public MNIST versions (IBM's config.py)
        "em": {"conv1_channels": 64, "primary_types": 8, "caps1_types": 16, "caps2_types": 16},
    },
    # A plain small CNN to measure CapsNet against on own data: two 5x5 convolutions (16, 32)
    # each followed by 2x2 max-pooling, FC 64 (0.11M parameters at 28x28, 0.15M for 32x32
    # RGB). For CapsNet the name means the 'small' sizes.
    "tiny": {
        "capsnet": {"conv1_channels": 32, "primary_types": 8, "decoder_hidden": (64, 128)},
        "cnn": {"conv_channels": (16, 32), "pool": 2, "fc_hidden": (64,), "dropout": 0.25},
    },
    # Half the paper's channels, the paper's FC sizes: on the affNIST 40x40 canvas the CNN
    # has about the paper CNN's 28x28 parameter count (the full one has twice as many).
    "half": {
        "capsnet": {"conv1_channels": 128, "primary_types": 16},
        "cnn": {"conv_channels": (128, 128, 64)},
    },
    # Section 7: CIFAR-10 with 64 primary capsule types and a none-of-the-above category,
    # trained on random 24x24 crops (PRESET_CROPS).
    "cifar10": {"capsnet": {"primary_types": 64, "none_of_the_above": True}, "cnn": {}},
    # Section 7: SVHN with 64 Conv1 channels, 16 types of 6-D primary capsules, 8-D capsules.
    "svhn": {"capsnet": {"conv1_channels": 64, "primary_types": 16, "primary_dim": 6,
                         "digit_dim": 8}, "cnn": {}},
}
# Training crops a preset asks for (random crops in training, the centre crop in evaluation).
PRESET_CROPS: dict[str, int] = {"cifar10": 24}


def make_config(model: str, preset: str = "paper", **overrides):
    """Config for ``model`` ('capsnet', 'cnn', 'efficient' or 'em') from a named preset
    plus overrides."""
    if model not in MODEL_CONFIGS:
        raise ValueError(f"unknown model {model!r}; choose from {sorted(MODEL_CONFIGS)}")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    if model not in PRESETS[preset]:
        offered = sorted(name for name, sizes in PRESETS.items() if model in sizes)
        raise ValueError(f"preset {preset!r} has no {model} sizes; choose from "
                         f"{', '.join(offered)}")
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
