"""Matrix capsules with EM routing (Hinton, Sabour & Frosst 2018, Figure 1):
ReLU Conv1 -> PrimaryCaps -> ConvCaps1 -> ConvCaps2 -> Class capsules."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from capsnet.config import NormalisedDataConfig, conv_output_size, stack_fields
from capsnet.layers import GemmConv2d, InputNorm
from capsnet.layers.matrix_caps import ClassCapsules, ConvMatrixCaps, PrimaryMatrixCaps
from capsnet.models.base import (
    POSITION_MAJOR,
    Children,
    ClassRouting,
    ModelEntry,
    ModelOutput,
    autocast_to,
)


@dataclass(frozen=True)
class EMCapsNetConfig(NormalisedDataConfig):
    """The matrix-capsule network of Hinton, Sabour & Frosst (2018), section 4: ReLU Conv1
    (5x5, stride 2, A) -> PrimaryCaps (1x1, B types) -> ConvCaps1 (3x3, stride 2, C) ->
    ConvCaps2 (3x3, stride 1, D) -> class capsules with coordinate addition; EM routing,
    spread loss. Defaults are the paper's A = B = C = D = 32; ``small`` trains on a CPU."""

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
        """The smallest input side with a 1x1 ConvCaps2 grid: one ConvCaps2 capsule's field."""
        return stack_fields(self.layers, 1)[1]

    @property
    def class_coordinates(self) -> tuple[float, ...]:
        """Each ConvCaps2 row's receptive-field centre, scaled by the image size to (0, 1)."""
        centres, _ = stack_fields(self.layers, self.caps2_grid)
        return tuple((centre + 0.5) / self.image_size for centre in centres)  # pixel centre


# The primary poses' RMS after :meth:`EMCapsNet.initialise_from_data`: unit-scale poses keep
# the votes' variances, which the E-steps divide by, from being tiny (docs/models-em.md).
PRIMARY_POSE_RMS = 1.0


class EMCapsNet(nn.Module):
    """Input images (B, C, H, W) in [0, 1]; a :class:`ModelOutput`: the class
    capsules' activations a_j (B, J) as scores, their 4x4 poses (B, J, 16) row-major, no
    reconstructions.
    ``compute_dtype`` is the convolutions' autocast dtype; votes and routing run in float32.
    ``labels`` is accepted and unused (no decoder)."""

    def __init__(self, config: EMCapsNetConfig = EMCapsNetConfig()):
        super().__init__()
        cfg = self.config = config
        iterations, final_lambda = cfg.routing_iterations, cfg.final_lambda
        self.input_norm = InputNorm(cfg.input_norm)
        self.conv1 = GemmConv2d(cfg.in_channels, cfg.conv1_channels, cfg.conv1_kernel,
                                stride=cfg.conv1_stride)
        self.primary_caps = PrimaryMatrixCaps(cfg.conv1_channels, cfg.primary_types)
        self.conv_caps1 = ConvMatrixCaps(cfg.primary_types, cfg.caps1_types, cfg.caps_kernel,
                                         cfg.caps1_stride, cfg.conv1_grid, iterations, final_lambda)
        self.conv_caps2 = ConvMatrixCaps(cfg.caps1_types, cfg.caps2_types, cfg.caps_kernel,
                                         cfg.caps2_stride, cfg.caps1_grid, iterations, final_lambda)
        self.class_caps = ClassCapsules(cfg.caps2_types, cfg.num_classes, cfg.class_coordinates,
                                        iterations, final_lambda)
        self.compute_dtype: torch.dtype | None = None

    @torch.no_grad()
    def initialise_from_data(self, images: torch.Tensor) -> str:
        """Scale the primary pose units so that the poses of ``images`` have RMS
        PRIMARY_POSE_RMS (a fresh model only); returns what it did, for the log."""
        with torch.autocast(device_type=images.device.type, enabled=False):
            h = torch.relu(self.conv1(self.input_norm(images)))  # (B, A, 12, 12)
            poses, _ = self.primary_caps(h)  # (B, 12, 12, B_types, 16)
        rms = poses.pow(2).mean().sqrt().item()
        if not rms > 0:
            return f"primary poses all zero on {len(images)} images: left as initialised"
        self.primary_caps.scale_poses(PRIMARY_POSE_RMS / rms)
        return (f"primary pose units scaled by {PRIMARY_POSE_RMS / rms:.3g} (pose RMS "
                f"{rms:.3g} -> {PRIMARY_POSE_RMS:g} on {len(images)} training images)")

    def forward_routing(self, x: torch.Tensor) -> ClassRouting:
        """Conv1 -> PrimaryCaps -> ConvCaps1 -> ConvCaps2 -> class votes and EM routing."""
        with autocast_to(x.device, self.compute_dtype):
            h = torch.relu(self.conv1(self.input_norm(x)))  # (B, 32, 12, 12)
            poses, a = self.primary_caps(h)  # (B, 12, 12, 32, 16), (B, 12, 12, 32) float32
            poses, a = self.conv_caps1(poses, a)  # (B, 5, 5, 32, 16), (B, 5, 5, 32)
            poses, a = self.conv_caps2(poses, a)  # (B, 3, 3, 32, 16), (B, 3, 3, 32)
        votes, a, routed = self.class_caps(poses, a)  # (B, 10, 288, 16), (B, 288)
        return ClassRouting(a, votes, a, routed, self.class_caps.router)

    def forward_head(self, routing: ClassRouting,
                     labels: torch.Tensor | None = None) -> ModelOutput:
        routed = routing.routed
        return ModelOutput(routed.activations, routed.poses,  # (B, 10), (B, 10, 16)
                           loss=ENTRY.loss)

    def forward(self, x: torch.Tensor,
                labels: torch.Tensor | None = None) -> ModelOutput:
        return self.forward_head(self.forward_routing(x))


def routing_view(config: EMCapsNetConfig) -> Children:
    """ConvCaps2's capsules, position-major i = (row, column, type)."""
    return Children(config.caps2_types, config.caps2_grid, POSITION_MAJOR,
                    *stack_fields(config.layers, config.caps2_grid), "ConvCaps2", "activation")


ENTRY = ModelEntry(
    name="em", config=EMCapsNetConfig, model=EMCapsNet,
    summary="matrix capsules with EM routing (Hinton et al. 2018; presets paper and small; "
            "spread loss; default Adam rate 3e-3; docs/models-em.md)",
    # small: A=64, B=8, C=D=16, the sizes of public MNIST versions (IBM's config.py)
    presets={"paper": {},
             "small": {"conv1_channels": 64, "primary_types": 8, "caps1_types": 16,
                       "caps2_types": 16}},
    # Adam at 3e-3, the authors' answer on OpenReview (https://openreview.net/forum?id=HJWLfGWRb).
    lr=3e-3,
    # The fast recipe at EM's own peak rate (docs/models-em.md, "The fast recipe, planned
    # for 15 epochs").
    recipes={"fast": {"lr_scale": 1.0}},
    routing_view=routing_view,
    initialise=EMCapsNet.initialise_from_data,
    loss="spread",
)
