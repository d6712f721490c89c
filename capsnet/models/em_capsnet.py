"""Matrix capsules with EM routing (Hinton, Sabour & Frosst 2018, Figure 1):
ReLU Conv1 -> PrimaryCaps -> ConvCaps1 -> ConvCaps2 -> Class capsules."""
from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from capsnet.config import EMCapsNetConfig, stack_fields
from capsnet.layers import GemmConv2d, InputNorm
from capsnet.layers.matrix_caps import ClassCapsules, ConvMatrixCaps, PrimaryMatrixCaps
from capsnet.models.capsnet import CapsuleOutput
from capsnet.models.entry import POSITION_MAJOR, Children, ClassRouting, ModelEntry
from capsnet.models.precision import autocast_to


class MatrixCapsuleOutput(CapsuleOutput):
    """A :class:`CapsuleOutput` whose ``lengths`` are the class capsules' activations a_j
    in [0, 1] (the class scores), ``poses`` their 4x4 poses flattened (B, J, 16), and
    ``reconstructions`` None. ``loss_name`` tells capsnet.losses.model_loss (which imports
    no model) to train it with the spread loss."""

    __slots__ = ()
    loss_name: ClassVar[str] = "spread"


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

    def forward_routing(self, x: torch.Tensor) -> ClassRouting:
        """Conv1 -> PrimaryCaps -> ConvCaps1 -> ConvCaps2 -> the class capsules' votes and
        EM routing."""
        with autocast_to(x.device, self.compute_dtype):
            h = torch.relu(self.conv1(self.input_norm(x)))  # (B, 32, 12, 12)
            poses, a = self.primary_caps(h)  # (B, 12, 12, 32, 16), (B, 12, 12, 32) float32
            poses, a = self.conv_caps1(poses, a)  # (B, 5, 5, 32, 16), (B, 5, 5, 32)
            poses, a = self.conv_caps2(poses, a)  # (B, 3, 3, 32, 16), (B, 3, 3, 32)
        votes, a, routed = self.class_caps.route(poses, a)  # (B, 10, 288, 16), (B, 288)
        return ClassRouting(a, votes, a, routed, self.class_caps.router)

    def forward(self, x: torch.Tensor,
                labels: torch.Tensor | None = None) -> MatrixCapsuleOutput:
        routed = self.forward_routing(x).routed
        return MatrixCapsuleOutput(routed.activations, routed.poses, None)  # (B, 10), (B, 10, 16)


def routing_view(config: EMCapsNetConfig) -> Children:
    """ConvCaps2's capsules, position-major i = (row, column, type): where the classes
    compete (the convolutional capsule layers below route too)."""
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
    # Adam at 3e-3, the authors' answer on OpenReview ("We use an exponential decay with
    # learning rate: 3e-3, decay_steps: 20000, decay rate: 0.96",
    # https://openreview.net/forum?id=HJWLfGWRb, quoted in IBM/matrix-capsules-with-em-routing
    # train_val.py, whose config.py uses it too).
    lr=3e-3,
    # The fast recipe at EM's own rate: a peak of 3e-3 (lr_scale 1), not 3 x 3e-3 (Adam at
    # 1e-2 did not learn faster, docs/models-em.md), warm-up, cosine to 1e-5 and the EMA as
    # CapsNet's over 15 epochs. The spread loss's margin grows over the run, so a short run
    # grows it too fast: planned for 6 epochs the small model with 2 iterations reached
    # validation 97.36%; planned for 15, 98.16% at epoch 6 (docs/models-em.md, "The fast
    # recipe, planned for 15 epochs"); chosen on validation only.
    recipes={"fast": {"lr_scale": 1.0}},
    routing_view=routing_view,
    initialise=EMCapsNet.initialise_from_data,
    scores="activations",
    # EM routing normalises each child's assignments over its parents by a scatter-max (for
    # a stable logsumexp): ONNX's ScatterElements reduction 'max' is opset 18.
    onnx_opset=18,
)
