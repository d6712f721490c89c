"""The capsule head's baseline: the same backbone (:class:`capsnet.layers.ResidualStem`)
with global average pooling and a linear classifier, so that the head is what differs."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from capsnet.config import NormalisedDataConfig
from capsnet.layers import InputNorm, ResidualStem
from capsnet.models.base import ModelEntry, ModelOutput, autocast_to


@dataclass(frozen=True)
class StemCNNConfig(NormalisedDataConfig):
    stem_width: int = 16
    stem_max_width: int = 256
    feature_grid: int = 8


class StemCNN(nn.Module):
    """(B, C, H, W) in [0, 1] -> :class:`ModelOutput` from the logits (B, classes)."""

    def __init__(self, config: StemCNNConfig = StemCNNConfig()):
        super().__init__()
        cfg = self.config = config
        self.input_norm = InputNorm(cfg.input_norm)
        self.backbone = ResidualStem(cfg.in_channels, cfg.image_size, cfg.stem_width,
                                     cfg.stem_max_width, cfg.feature_grid)
        self.classifier = nn.Linear(self.backbone.out_channels, cfg.num_classes)
        self.compute_dtype: torch.dtype | None = None

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> ModelOutput:
        with autocast_to(x.device, self.compute_dtype):
            features = self.backbone(self.input_norm(x))  # (B, C', G, G)
            logits = self.classifier(features.mean(dim=(2, 3)))  # (B, classes)
        return ModelOutput.from_logits(logits.float(), loss=ENTRY.loss)


ENTRY = ModelEntry(
    name="stemcnn", config=StemCNNConfig, model=StemCNN,
    summary="the capsule head's backbone with a linear head (its baseline)",
    presets={"paper": {}, "small": {"stem_width": 8, "stem_max_width": 64}},
    lr=1e-3,
    loss="cross_entropy",
)
