"""CapsNet (Sabour, Frosst & Hinton 2017, Fig. 1): Conv1 -> PrimaryCaps -> DigitCaps -> Decoder."""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from capsnet.config import ConfigError, NormalisedDataConfig, conv_output_size, stack_fields
from capsnet.layers import Decoder, DigitCaps, GemmConv2d, InputNorm, PrimaryCaps, full_precision
from capsnet.layers.routed_caps import W_INIT_STD
from capsnet.models.base import (
    TYPE_MAJOR,
    Children,
    ClassRouting,
    ModelEntry,
    ModelOutput,
    autocast_to,
)
from capsnet.routing import capsnet_routers, router_class


@dataclass(frozen=True)
class CapsNetConfig(NormalisedDataConfig):
    """The CapsNet of Sabour, Frosst & Hinton (2017), Figures 1 and 2; defaults are the paper's."""

    conv1_channels: int = 256
    conv1_kernel: int = 9
    # 1 in the paper; larger inputs of other data take a larger one (capsnet.data.model_view.
    # conv1_stride_for) so that the primary capsules stay near the paper's count
    conv1_stride: int = 1
    primary_types: int = 32  # capsule types ("channels") in PrimaryCaps
    primary_dim: int = 8
    primary_kernel: int = 9
    primary_stride: int = 2
    digit_dim: int = 16
    # The routing algorithm from primary to digit capsules, by its registered name
    # (capsnet.routing.ROUTERS): 'dynamic' (the paper's Procedure 1),
    # 'inverted-attention' (Tsai et al. 2020) or 'self-attention'. Checked against the
    # registered routers when the model is made (capsnet.models.capsnet).
    routing: str = "dynamic"
    routing_iterations: int = 3
    routing_full_graph: bool = False  # backpropagate through every routing iteration
    # The released code's (tensorflow/models, research/capsules) departures, off here: its
    # capsule layer's `biases` (J, D), 0.1 at first, added to s before every squash; and
    # its weight_variable's stddev, 0.1 for DigitCaps' W (the paper model's 0.01)
    routing_biases: bool = False
    digit_weights_stddev: float = W_INIT_STD
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
        if self.digit_weights_stddev <= 0:
            raise ValueError(f"digit_weights_stddev must be positive, not "
                             f"{self.digit_weights_stddev}")

    @property
    def layers(self) -> tuple[tuple[int, int], ...]:
        """(kernel, stride) of Conv1 and PrimaryCaps."""
        return (self.conv1_kernel, self.conv1_stride), (self.primary_kernel, self.primary_stride)

    @property
    def smallest_image_size(self) -> int:
        """The smallest input side with a 1x1 primary grid: one primary capsule's field (17)."""
        return stack_fields(self.layers, 1)[1]

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


class CapsNet(nn.Module):
    """Input images (B, C, H, W) in [0, 1]; a :class:`ModelOutput`: the class scores
    (B, J), the poses v (B, J, D) and the reconstructions (B, C, H, W) or None.

    ``config.routing`` names the router (its activations are the class scores); the decoder
    gets the poses masked by ``labels`` (training) or by the best capsule (inference).
    ``compute_dtype`` (None: float32) is the autocast dtype of the convolutions and the
    decoder; routing and squash run in float32, every output is float32."""

    def __init__(self, config: CapsNetConfig = CapsNetConfig()):
        super().__init__()
        cfg = self.config = config
        self.input_norm = InputNorm(cfg.input_norm)  # no parameters: the paper's model is kept
        self.conv1 = GemmConv2d(cfg.in_channels, cfg.conv1_channels, kernel_size=cfg.conv1_kernel,
                                stride=cfg.conv1_stride)
        self.primary_caps = PrimaryCaps(cfg.conv1_channels, cfg.primary_types, cfg.primary_dim,
                                        cfg.primary_kernel, cfg.primary_stride)
        router = router_class(cfg.routing).from_config(
            cfg, children=cfg.num_primary_caps, parents=cfg.num_classes, pose_dim=cfg.digit_dim)
        self.digit_caps = DigitCaps(cfg.num_primary_caps, cfg.primary_dim, cfg.num_classes,
                                    cfg.digit_dim, router, init_std=cfg.digit_weights_stddev)
        image_shape = (cfg.in_channels, cfg.image_size, cfg.image_size)
        self.decoder = (Decoder(cfg.num_classes, cfg.digit_dim, cfg.decoder_hidden, image_shape)
                        if cfg.use_decoder else None)
        self.compute_dtype: torch.dtype | None = None

    def forward_routing(self, x: torch.Tensor) -> ClassRouting:
        """Conv1 -> PrimaryCaps -> the votes for DigitCaps and their routing."""
        with autocast_to(x.device, self.compute_dtype):
            h = torch.relu(self.conv1(self.input_norm(x)))  # (B, 256, 20, 20)
            u = self.primary_caps(h)  # (B, 1152, 8) float32, type-major
        u_hat, routed = self.digit_caps.route(u)  # (B, 10, 1152, 16), Routed
        return ClassRouting(u, u_hat, None, routed, self.digit_caps.router)

    def forward_head(self, routing: ClassRouting,
                     labels: torch.Tensor | None = None) -> ModelOutput:
        """The routed class capsules, and the decoder's image of the one ``labels`` names."""
        v, lengths = routing.routed.poses, routing.routed.activations  # (B, 10, 16), (B, 10)
        reconstructions = None
        if self.decoder is not None:
            with autocast_to(v.device, self.compute_dtype):
                keep = labels if labels is not None else lengths.argmax(dim=-1)  # (B,)
                reconstructions = full_precision(self.decoder(v, keep))  # (B, 1, 28, 28)
        return ModelOutput(lengths, v, reconstructions, loss=ENTRY.loss)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> ModelOutput:
        return self.forward_head(self.forward_routing(x), labels)


# CapsNet's options that only some routers take: the option -> the router's argument.
ROUTER_OPTIONS = {"routing_iterations": "iterations", "routing_full_graph": "full_graph",
                  "none_of_the_above": "none_of_the_above", "routing_biases": "biases"}


def check_routing(values: dict, given: set[str]) -> None:
    """ConfigError for a router CapsNet cannot hold or an option its router lacks."""
    routing = values["routing"]
    if routing not in capsnet_routers():
        raise ConfigError(f"unknown routing {routing!r} for capsnet; choose from "
                          f"{', '.join(capsnet_routers())}")
    takes = inspect.signature(router_class(routing)).parameters
    for option, argument in ROUTER_OPTIONS.items():
        if option in given and argument not in takes:
            honoured = [name for name in capsnet_routers()
                        if argument in inspect.signature(router_class(name)).parameters]
            raise ConfigError(f"{routing} routing takes no {option}; it is an option "
                              f"of {', '.join(honoured)} routing")


def routing_view(config: CapsNetConfig) -> Children:
    """The primary capsules, type-major i = (type, row, column), and their receptive fields."""
    return Children(config.primary_types, config.primary_grid, TYPE_MAJOR,
                    *stack_fields(config.layers, config.primary_grid), "primary", "length")


# The narrow sizes for tests and quick CPU runs.
SMALL = {"conv1_channels": 32, "primary_types": 8, "decoder_hidden": (64, 128)}

ENTRY = ModelEntry(
    name="capsnet", config=CapsNetConfig, model=CapsNet, summary="CapsNet (Sabour et al. 2017)",
    presets={
        "paper": {},
        "small": SMALL,
        "tiny": SMALL,  # the CNN's 'tiny' comparison; for CapsNet the 'small' sizes
        "half": {"conv1_channels": 128, "primary_types": 16},  # half the paper's channels
        # Section 7: CIFAR-10 with 64 primary capsule types and a none-of-the-above
        # category, trained on random 24x24 crops (registry.PRESET_CROPS).
        "cifar10": {"primary_types": 64, "none_of_the_above": True},
        # Section 7: SVHN with 64 Conv1 channels, 16 types of 6-D primary capsules, 8-D capsules.
        "svhn": {"conv1_channels": 64, "primary_types": 16, "primary_dim": 6, "digit_dim": 8},
    },
    lr=1e-3,  # the paper's Adam rate
    check=check_routing,
    routing_view=routing_view,
)
