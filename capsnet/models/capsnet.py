"""CapsNet (Sabour, Frosst & Hinton 2017, Fig. 1): Conv1 -> PrimaryCaps -> DigitCaps -> Decoder."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from capsnet.config import CapsNetConfig
from capsnet.layers import Decoder, DigitCaps, GemmConv2d, InputNorm, PrimaryCaps, full_precision
from capsnet.models.precision import autocast_to
from capsnet.routing import router_class


class CapsuleOutput(NamedTuple):
    lengths: torch.Tensor  # (B, J) the class scores: the router's activations (|v| for dynamic)
    poses: torch.Tensor  # (B, J, D) DigitCaps output vectors v
    reconstructions: torch.Tensor | None  # (B, C, H, W), None without a decoder


class CapsNet(nn.Module):
    """Input images (B, C, H, W) scaled to [0, 1]; output :class:`CapsuleOutput`.
    ``config.input_norm`` says how they meet Conv1; the decoder reconstructs them as given.

    ``config.routing`` names the routing algorithm (:data:`capsnet.routing.ROUTERS`);
    its activations are the class scores (``lengths``: |v| for the paper's dynamic routing).
    The decoder is fed the poses masked by ``labels`` when given (training), else by
    the highest-scoring capsule (inference). ``compute_dtype`` (None: float32; set by
    :func:`capsnet.tuning.apply_plan`) is the autocast dtype of the convolutions and the
    decoder; routing and squash run in float32 and every output is float32.
    """

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
                                    cfg.digit_dim, router)
        image_shape = (cfg.in_channels, cfg.image_size, cfg.image_size)
        self.decoder = (Decoder(cfg.num_classes, cfg.digit_dim, cfg.decoder_hidden, image_shape)
                        if cfg.use_decoder else None)
        self.compute_dtype: torch.dtype | None = None

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> CapsuleOutput:
        with autocast_to(x.device, self.compute_dtype):
            h = torch.relu(self.conv1(self.input_norm(x)))  # (B, 256, 20, 20)
            u = self.primary_caps(h)  # (B, 1152, 8) float32
            routed = self.digit_caps(u)
            v, lengths = routed.poses, routed.activations  # (B, 10, 16), (B, 10) float32
            reconstructions = None
            if self.decoder is not None:
                keep = labels if labels is not None else lengths.argmax(dim=-1)  # (B,)
                reconstructions = full_precision(self.decoder(v, keep))  # (B, 1, 28, 28)
        return CapsuleOutput(lengths, v, reconstructions)
