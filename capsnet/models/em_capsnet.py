"""Matrix capsules with EM routing (Hinton, Sabour & Frosst 2018, Figure 1):
ReLU Conv1 -> PrimaryCaps -> ConvCaps1 -> ConvCaps2 -> Class capsules."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from capsnet.config import EMCapsNetConfig
from capsnet.layers import GemmConv2d, InputNorm
from capsnet.layers.matrix_caps import ClassCapsules, ConvMatrixCaps, PrimaryMatrixCaps
from capsnet.models.precision import autocast_to


class MatrixCapsuleOutput(NamedTuple):
    """What :class:`EMCapsNet` returns: the class capsules' activations a_j in [0, 1] (the
    class scores) and their 4x4 poses flattened. No reconstructions: the model has no
    decoder. ``loss_name`` tells capsnet.losses.model_loss (which imports no model) to train
    it with the spread loss."""

    activations: torch.Tensor  # (B, J) a_j, the class scores
    poses: torch.Tensor  # (B, J, 16) the class capsules' 4x4 poses, row-major
    loss_name = "spread"  # a class attribute, not a field


# The primary poses' root mean square after the data-dependent initialisation
# (:meth:`EMCapsNet.initialise_from_data`): unit-scale poses give votes whose variances are
# not tiny, and EM routing's E-steps divide by those variances (docs/models-em.md,
# "Initialisation").
PRIMARY_POSE_RMS = 1.0


class EMCapsNet(nn.Module):
    """Input images (B, C, H, W) scaled to [0, 1]; output :class:`MatrixCapsuleOutput`.
    ``compute_dtype`` (None: float32) is the autocast dtype of the two convolutions; votes
    and EM routing run in float32. ``labels`` is accepted (the training loop passes them)
    and unused: the model has no decoder."""

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
        """Scale the primary capsules' pose units so that the poses of ``images`` (B, C, H, W)
        in [0, 1] have the root mean square PRIMARY_POSE_RMS; the training run calls it once
        on a fresh model (never on a resumed one). Returns what it did, for the log."""
        with torch.autocast(device_type=images.device.type, enabled=False):
            h = torch.relu(self.conv1(self.input_norm(images)))  # (B, A, 12, 12)
            poses, _ = self.primary_caps(h)  # (B, 12, 12, B_types, 16)
        rms = poses.pow(2).mean().sqrt().item()
        if not rms > 0:
            return f"primary poses all zero on {len(images)} images: left as initialised"
        self.primary_caps.scale_poses(PRIMARY_POSE_RMS / rms)
        return (f"primary pose units scaled by {PRIMARY_POSE_RMS / rms:.3g} (pose RMS "
                f"{rms:.3g} -> {PRIMARY_POSE_RMS:g} on {len(images)} training images)")

    def forward(self, x: torch.Tensor,
                labels: torch.Tensor | None = None) -> MatrixCapsuleOutput:
        with autocast_to(x.device, self.compute_dtype):
            h = torch.relu(self.conv1(self.input_norm(x)))  # (B, 32, 12, 12)
            poses, a = self.primary_caps(h)  # (B, 12, 12, 32, 16), (B, 12, 12, 32) float32
            poses, a = self.conv_caps1(poses, a)  # (B, 5, 5, 32, 16), (B, 5, 5, 32)
            poses, a = self.conv_caps2(poses, a)  # (B, 3, 3, 32, 16), (B, 3, 3, 32)
            poses, a = self.class_caps(poses, a)  # (B, 10, 16), (B, 10)
        return MatrixCapsuleOutput(a, poses)
