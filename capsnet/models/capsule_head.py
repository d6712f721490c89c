"""Capsules on a backbone: any feature extractor (B, C, H, W) -> (B, C', G, G), then primary
capsules on its grid, optional convolutional capsule layers and class capsules whose
matrices are shared across positions. Parameters grow with the feature channels and the
classes, not with the image's area; the votes' memory with G^2 times the classes.

    create_model("capshead", image_size=224, in_channels=3, num_classes=1000)
    CapsuleHeadNet(CapsuleHeadConfig(...), backbone=my_module)  # your own nn.Module

``backbone`` 'stem' is :class:`capsnet.layers.ResidualStem`, 'conv1' the paper's Conv1 (with
``primary_kernel`` 9 and ``primary_stride`` 2 the paper's PrimaryCaps on it); weights for
either from a state-dict file (``backbone_weights``)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from capsnet.config import ConfigError, NormalisedDataConfig
from capsnet.layers import (
    ConvCapsules,
    Decoder,
    GemmConv2d,
    InputNorm,
    ResidualStem,
    SharedClassCapsules,
    full_precision,
    squash,
)
from capsnet.layers.routed_caps import balanced_init_std
from capsnet.models.base import ModelEntry, ModelOutput, autocast_to
from capsnet.routing import ROUTERS, make_router

BACKBONES = ("stem", "conv1")
# Data-dependent start (:func:`calibrate_lengths`): each routed layer's W is scaled until its
# capsules' mean length on training images is this (squash's |s| = 1), in a few rounds.
TARGET_LENGTH = 0.5
CALIBRATION_ROUNDS = 6
CALIBRATION_IMAGES = 256
LENGTH_CLAMP = (1e-4, 0.999)
FEATURE_NDIM = 4  # (B, C, H, W)


@dataclass(frozen=True)
class CapsuleHeadConfig(NormalisedDataConfig):
    """A backbone, primary capsules, ``conv_caps`` convolutional capsule layers (their types),
    class capsules shared across positions; every size derived from these numbers."""

    backbone: str = "stem"  # 'stem' (a small residual network) or 'conv1' (the paper's Conv1)
    backbone_weights: str = ""  # a state-dict file for the backbone; '' starts fresh
    stem_width: int = 16
    stem_max_width: int = 256
    feature_grid: int = 8  # the stem halves the image until its side is at most this
    conv1_channels: int = 256
    conv1_kernel: int = 9
    conv1_stride: int = 1
    primary_kernel: int = 1  # the primary capsules' convolution on the features
    primary_stride: int = 1
    primary_types: int = 16
    primary_dim: int = 8
    conv_caps: tuple[int, ...] = ()  # types of each convolutional capsule layer
    conv_caps_dim: int = 8
    conv_caps_kernel: int = 3
    conv_caps_stride: int = 1
    class_dim: int = 16
    coordinate_addition: bool = True
    routing: str = "dynamic"  # any capsnet.routing.ROUTERS name
    routing_iterations: int = 3
    # A reconstruction decoder of C*H*W pixels, as CapsNet's, for small images only: off
    # unless asked for (at 224x224x3 it would hold 154M parameters); --reconstruction-weight
    # weighs its loss when it is on. Not named use_decoder, which training switches on.
    reconstruct: bool = False
    decoder_hidden: tuple[int, ...] = (512, 1024)


def check_head(values: dict, given: set[str]) -> None:
    """ConfigError for an unknown backbone or router."""
    if values["backbone"] not in BACKBONES:
        raise ConfigError(f"unknown backbone {values['backbone']!r}; choose from "
                          f"{', '.join(BACKBONES)} (or pass your nn.Module to CapsuleHeadNet)")
    if values["routing"] not in ROUTERS:
        raise ConfigError(f"unknown routing {values['routing']!r} for capshead; choose from "
                          f"{', '.join(sorted(ROUTERS))}")


def build_backbone(cfg: CapsuleHeadConfig) -> nn.Module:
    """The backbone ``cfg.backbone`` names, with ``cfg.backbone_weights`` loaded."""
    if cfg.backbone == "stem":
        backbone = ResidualStem(cfg.in_channels, cfg.image_size, cfg.stem_width,
                                cfg.stem_max_width, cfg.feature_grid)
    else:
        backbone = nn.Sequential(GemmConv2d(cfg.in_channels, cfg.conv1_channels,
                                            cfg.conv1_kernel, stride=cfg.conv1_stride),
                                 nn.ReLU())
    if cfg.backbone_weights and not next(backbone.parameters()).is_meta:
        state = torch.load(cfg.backbone_weights, map_location="cpu", weights_only=True)
        backbone.load_state_dict(state)
    return backbone


@torch.no_grad()
def feature_shape(backbone: nn.Module, in_channels: int, image_size: int) -> tuple[int, int, int]:
    """(C, H, W) of the backbone's output for one image; ValueError in one line unless it
    returns feature maps (B, C, H, W)."""
    parameter = next(backbone.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")
    training = backbone.training
    backbone.eval()
    out = backbone(torch.zeros(1, in_channels, image_size, image_size, device=device))
    backbone.train(training)
    if not isinstance(out, torch.Tensor) or out.dim() != FEATURE_NDIM:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"a capsule head needs a backbone that returns feature maps (B, C, H, "
                         f"W) for ({in_channels}, {image_size}, {image_size}) images, got "
                         f"{shape}: cut off its pooling and classifier (for a torchvision "
                         f"ResNet, nn.Sequential(*list(resnet.children())[:-2]))")
    return tuple(out.shape[1:])


class CapsuleHead(nn.Module):
    """Features (B, C, H, W) -> primary capsules (B, H', W', T, d) -> convolutional capsule
    layers -> class capsules: poses (B, J, D) and activations (B, J). Built for the feature
    shape (C, H, W) it is given."""

    def __init__(self, features: tuple[int, int, int], cfg: CapsuleHeadConfig):
        super().__init__()
        channels, height, width = features
        if min(height, width) < cfg.primary_kernel:
            raise ValueError(f"the backbone's {height}x{width} feature maps are smaller than "
                             f"the primary capsules' {cfg.primary_kernel}x{cfg.primary_kernel} "
                             f"kernel: use a larger image_size or primary_kernel=1")
        self.types, self.dim = cfg.primary_types, cfg.primary_dim
        self.primary = GemmConv2d(channels, cfg.primary_types * cfg.primary_dim,
                                  cfg.primary_kernel, stride=cfg.primary_stride)
        grid = ((height - cfg.primary_kernel) // cfg.primary_stride + 1,
                (width - cfg.primary_kernel) // cfg.primary_stride + 1)
        layers, types, dim = [], cfg.primary_types, cfg.primary_dim
        k = cfg.conv_caps_kernel
        for out_types in cfg.conv_caps:
            children = k * k * types
            router = make_router(cfg.routing, children=children, parents=out_types,
                                 pose_dim=cfg.conv_caps_dim, iterations=cfg.routing_iterations)
            layer = ConvCapsules(types, dim, out_types, cfg.conv_caps_dim, router, kernel=k,
                                 stride=cfg.conv_caps_stride, padding=k // 2,
                                 init_std=balanced_init_std(children, out_types,
                                                            cfg.conv_caps_dim))
            layers.append(layer)
            grid = layer.out_grid(*grid)
            types, dim = out_types, cfg.conv_caps_dim
        self.conv_caps = nn.ModuleList(layers)
        children = grid[0] * grid[1] * types
        router = make_router(cfg.routing, children=children, parents=cfg.num_classes,
                             pose_dim=cfg.class_dim, iterations=cfg.routing_iterations)
        self.class_caps = SharedClassCapsules(
            types, dim, cfg.num_classes, cfg.class_dim, router, cfg.coordinate_addition,
            init_std=balanced_init_std(children, cfg.num_classes, cfg.class_dim))

    def primary_capsules(self, features: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> squashed capsules (B, H', W', T, d), float32 (the features are
        read in float32: a backbone under autocast hands over bf16 or fp16)."""
        out = self.primary(full_precision(features))  # (B, T*d, H', W')
        B, _, H, W = out.shape
        u = out.view(B, self.types, self.dim, H, W).permute(0, 3, 4, 1, 2)  # (B, H, W, T, d)
        return squash(u)

    def layer_outputs(self, features: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every capsule layer's (poses, activations), primary first, classes last."""
        poses = self.primary_capsules(features)  # (B, H, W, T, d)
        outputs = [(poses, torch.linalg.vector_norm(poses, dim=-1))]
        activations = None
        for layer in self.conv_caps:
            poses, activations = layer(poses, activations)  # (B, H', W', T', d')
            outputs.append((poses, activations))
        routed = self.class_caps(poses, activations)
        outputs.append((routed.poses, routed.activations))  # (B, J, D), (B, J)
        return outputs

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer_outputs(features)[-1]


class CapsuleHeadNet(nn.Module):
    """Images (B, C, H, W) in [0, 1] -> :class:`ModelOutput` (scores: the class capsules'
    activations, their lengths for vector routers; poses; reconstructions with a decoder).
    ``backbone``: any module returning (B, C', G, G); default the config's."""

    def __init__(self, config: CapsuleHeadConfig = CapsuleHeadConfig(),
                 backbone: nn.Module | None = None):
        super().__init__()
        cfg = self.config = config
        self.input_norm = InputNorm(cfg.input_norm)
        self.backbone = backbone if backbone is not None else build_backbone(cfg)
        features = feature_shape(self.backbone, cfg.in_channels, cfg.image_size)
        self.head = CapsuleHead(features, cfg)
        image_shape = (cfg.in_channels, cfg.image_size, cfg.image_size)
        self.decoder = (Decoder(cfg.num_classes, cfg.class_dim, cfg.decoder_hidden, image_shape)
                        if cfg.reconstruct else None)
        self.compute_dtype: torch.dtype | None = None

    def features(self, x: torch.Tensor) -> torch.Tensor:
        with autocast_to(x.device, self.compute_dtype):
            return self.backbone(self.input_norm(x))  # (B, C', G, G)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> ModelOutput:
        poses, lengths = self.head(self.features(x))  # (B, J, D), (B, J)
        reconstructions = None
        if self.decoder is not None:
            with autocast_to(x.device, self.compute_dtype):
                keep = labels if labels is not None else lengths.argmax(dim=-1)  # (B,)
                reconstructions = full_precision(self.decoder(poses, keep))
        return ModelOutput(lengths, poses, reconstructions, loss=ENTRY.loss)


@torch.no_grad()
def calibrate_lengths(model: CapsuleHeadNet, images: torch.Tensor) -> str:
    """Scale each routed layer's W (and coordinate scale), first to last, so that its
    capsules' mean length on ``images`` is about TARGET_LENGTH: no layer starts saturated or
    dead, however many children it has. EM routing (activations are not lengths) is left as
    initialised. Buffers (batch-norm statistics) are restored afterwards."""
    head = model.head
    if head.class_caps.router.needs_activations:
        return "EM routing: W left as initialised"
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    features = model.features(images[:CALIBRATION_IMAGES].float())  # (N, C, G, G)
    layers = [*head.conv_caps, head.class_caps]
    target = math.sqrt(TARGET_LENGTH / (1 - TARGET_LENGTH))  # |s| with squash length TARGET
    means = []
    for index, layer in enumerate(layers):
        for _ in range(CALIBRATION_ROUNDS):
            mean = head.layer_outputs(features)[index + 1][1].mean().clamp(*LENGTH_CLAMP)
            factor = target / math.sqrt(mean / (1 - mean))  # squash: |s| = sqrt(l / (1 - l))
            layer.W.mul_(factor)
            if isinstance(layer, SharedClassCapsules):
                layer.coordinate_scale.mul_(factor)
        means.append(head.layer_outputs(features)[index + 1][1].mean().item())
    for name, b in model.named_buffers():
        b.copy_(buffers[name])
    return ("routed layers scaled to mean capsule lengths "
            + ", ".join(f"{m:.2f}" for m in means) + f" on {len(features)} images")


ENTRY = ModelEntry(
    name="capshead", config=CapsuleHeadConfig, model=CapsuleHeadNet,
    summary="capsules on a backbone, class capsules shared across positions (any size)",
    presets={
        "paper": {},
        "small": {"stem_width": 8, "stem_max_width": 64, "primary_types": 8},
        # three routed layers: two strided convolutional capsule layers (8x8 -> 4x4 -> 2x2
        # at the stem's usual grid), then the classes
        "deep": {"conv_caps": (16, 16), "conv_caps_stride": 2},
        # the paper's Conv1 (narrower, stride 2) and PrimaryCaps, one strided convolutional
        # capsule layer
        "conv": {"backbone": "conv1", "conv1_channels": 64, "conv1_stride": 2, "primary_kernel": 9,
                 "primary_stride": 2, "primary_types": 8, "conv_caps": (16,),
                 "conv_caps_stride": 2},
    },
    lr=1e-3,
    check=check_head,
    initialise=calibrate_lengths,
)
