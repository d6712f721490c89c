"""Efficient-CapsNet (Mazzia, Salvetti & Chiaberge 2021, Fig. 2): convolutions -> depthwise
primary capsules -> self-attention routing -> class capsules -> decoder, layer for layer as
the authors' code (ReLU then BatchNorm with Keras' constants, Keras' initialisations, the FC
512-1024 decoder fed the capsules masked by the label or the longest capsule)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from capsnet.config import DataConfig, conv_output_size, stack_fields
from capsnet.layers import Decoder, DepthwisePrimaryCaps, GemmConv2d, full_precision
from capsnet.models.base import POSITION_MAJOR, Children, ClassRouting, ModelEntry, autocast_to
from capsnet.models.capsnet import SMALL, CapsNet
from capsnet.routing import SelfAttentionRouter

# Keras' BatchNormalization defaults: moving averages kept at 0.99 per step (PyTorch's
# momentum is the new batch's share, 1 - 0.99) and epsilon 1e-3 (PyTorch's default: 1e-5).
BN_MOMENTUM = 0.01
BN_EPS = 1e-3
# Keras' truncated-normal initialisers cut at two standard deviations and divide the target
# standard deviation by this, the standard deviation of a unit normal truncated there.
TRUNCATED_NORMAL_STD = 0.87962566103423978


@dataclass(frozen=True)
class EfficientCapsNetConfig(DataConfig):
    """Efficient-CapsNet's MNIST model: valid convolutions with ReLU and BatchNorm, a depthwise
    ``primary_kernel`` convolution cut into ``primary_dim``-D capsules, self-attention
    routing to ``digit_dim``-D class capsules, the FC decoder (161,824 parameters without)."""

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


def keras_truncated_normal_(tensor: torch.Tensor, variance: float) -> torch.Tensor:
    """Keras' VarianceScaling truncated normal: std sqrt(variance) / 0.8796, cut at two stds."""
    std = math.sqrt(variance) / TRUNCATED_NORMAL_STD
    with torch.no_grad():
        return nn.init.trunc_normal_(tensor, 0.0, std, -2 * std, 2 * std)


def he_normal_(tensor: torch.Tensor, fan_in: int) -> torch.Tensor:
    """Keras' ``he_normal``: variance 2 / fan_in."""
    return keras_truncated_normal_(tensor, 2.0 / fan_in)


class ConvReLUBN(nn.Module):
    """A valid convolution, ReLU, then BatchNorm. (B, C_in, H, W) -> (B, C_out, H', W')."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int):
        super().__init__()
        self.conv = GemmConv2d(in_channels, out_channels, kernel, stride=stride)
        self.norm = nn.BatchNorm2d(out_channels, eps=BN_EPS, momentum=BN_MOMENTUM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.relu(self.conv(x)))


class SelfAttentionCaps(nn.Module):
    """A fully connected capsule layer: u_hat = W^T u by one einsum, W (I, J, in_dim, out_dim),
    then self-attention routing in float32. u (B, I, in_dim) -> Routed, poses (B, J, out_dim)."""

    def __init__(self, in_caps: int, in_dim: int, out_caps: int, out_dim: int):
        super().__init__()
        self.W = nn.Parameter(torch.empty(in_caps, out_caps, in_dim, out_dim))
        he_normal_(self.W, in_caps * out_caps * in_dim)  # Keras' fan-in of a 4-D kernel
        self.router = SelfAttentionRouter(out_caps, in_caps)

    def predictions(self, u: torch.Tensor) -> torch.Tensor:
        """u: (B, I, in_dim) -> u_hat: (B, J, I, out_dim), parent-major for the router."""
        return torch.einsum("bik,ijkd->bjid", u, self.W)  # (B, 10, 16, 16)

    def route(self, u: torch.Tensor):
        """u: (B, I, in_dim) -> the votes (B, J, I, out_dim) and their routing."""
        with torch.autocast(device_type=u.device.type, enabled=False):
            u_hat = self.predictions(full_precision(u))  # (B, 10, 16, 16)
            return u_hat, self.router(u_hat)

    def forward(self, u: torch.Tensor):
        return self.route(u)[1]


class EfficientCapsNet(nn.Module):
    """Images (B, C, H, W) in [0, 1] -> a :class:`ModelOutput`, as CapsNet's. The decoder gets
    the capsules masked by ``labels`` or the longest one; ``compute_dtype`` is the autocast
    dtype of convolutions and decoder; routing and squash run in float32."""

    def __init__(self, config: EfficientCapsNetConfig = EfficientCapsNetConfig()):
        super().__init__()
        cfg = self.config = config
        channels = (cfg.in_channels, *cfg.conv_channels)
        self.features = nn.Sequential(*(
            ConvReLUBN(c_in, c_out, kernel, stride) for c_in, c_out, kernel, stride
            in zip(channels[:-1], channels[1:], cfg.conv_kernels, cfg.conv_strides, strict=True)))
        self.primary_caps = DepthwisePrimaryCaps(cfg.conv_channels[-1], cfg.primary_dim,
                                                 cfg.primary_kernel)
        self.class_caps = SelfAttentionCaps(cfg.num_primary_caps, cfg.primary_dim,
                                            cfg.num_classes, cfg.digit_dim)
        image_shape = (cfg.in_channels, cfg.image_size, cfg.image_size)
        self.decoder = (Decoder(cfg.num_classes, cfg.digit_dim, cfg.decoder_hidden, image_shape)
                        if cfg.use_decoder else None)
        self.compute_dtype: torch.dtype | None = None
        self._init_as_the_public_code()

    def _init_as_the_public_code(self) -> None:
        """Keras' initialisers of the public code (W is initialised in SelfAttentionCaps)."""
        for block in self.features:
            he_normal_(block.conv.weight, block.conv.weight[0].numel())
            nn.init.zeros_(block.conv.bias)
        nn.init.xavier_uniform_(self.primary_caps.conv.weight)  # Keras' Conv2D default
        nn.init.zeros_(self.primary_caps.conv.bias)
        if self.decoder is not None:
            linears = [m for m in self.decoder.modules() if isinstance(m, nn.Linear)]
            for linear in linears[:-1]:
                he_normal_(linear.weight, linear.in_features)
            last = linears[-1]
            keras_truncated_normal_(last.weight, 2.0 / (last.in_features + last.out_features))
            for linear in linears:
                nn.init.zeros_(linear.bias)

    def forward_routing(self, x: torch.Tensor) -> ClassRouting:
        """Convolutions -> depthwise primary capsules -> the class capsules' votes and routing."""
        with autocast_to(x.device, self.compute_dtype):
            h = self.features(x)  # (B, 128, 9, 9)
            u = self.primary_caps(h)  # (B, 16, 8) float32, position-major
        u_hat, routed = self.class_caps.route(u)  # (B, 10, 16, 16), Routed
        return ClassRouting(u, u_hat, None, routed, self.class_caps.router)

    # as CapsNet's: the class capsules, then the decoder of the masked poses
    forward_head, forward = CapsNet.forward_head, CapsNet.forward


def routing_view(config: EfficientCapsNetConfig) -> Children:
    """The primary capsules, position-major i = (row, column, type)."""
    return Children(config.primary_types, config.primary_grid, POSITION_MAJOR,
                    *stack_fields(config.layers, config.primary_grid), "primary", "length")


ENTRY = ModelEntry(
    name="efficient", config=EfficientCapsNetConfig, model=EfficientCapsNet,
    summary="Efficient-CapsNet (Mazzia et al. 2021; presets paper and small; "
            "docs/models-efficient.md)",
    presets={"paper": {},
             "small": {"conv_channels": (16, 32, 32, 64),
                       "decoder_hidden": SMALL["decoder_hidden"]}},
    # "lr": 5e-4 in the public code's config.json.
    lr=5e-4,
    recipes={
        # The authors' MNIST recipe (EscVM/Efficient-CapsNet config.json and utils/tools.py):
        # lr * 0.97 ** epoch, never below 5e-5, batch 16, 150 epochs, their augmentation.
        "paper": {"epochs": 150, "batch_size": 16, "lr_decay": 0.97, "min_lr": 5e-5,
                  "augment": "efficient"},
        # The fast recipe at this model's rate, floor scaled alike, 25 epochs of the authors'
        # augmentation (docs/models-efficient.md, "The fast recipe, measured").
        "fast": {"epochs": 25, "min_lr": 5e-6, "augment": "efficient"},
    },
    routing_view=routing_view,
)
