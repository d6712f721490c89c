"""The paper's baseline CNN (Sabour et al. 2017, section 5): about 35.4M parameters."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from capsnet.config import CNNConfig
from capsnet.layers import Decoder, GemmConv2d, full_precision
from capsnet.models.precision import autocast_to


class CNNOutput(NamedTuple):
    """The output of a CNN with a reconstruction decoder (``config.decoder`` not "none")."""

    logits: torch.Tensor  # (B, classes)
    reconstructions: torch.Tensor  # (B, C, H, W)


class CNNBaseline(nn.Module):
    """Three 'same'-padded 5x5 conv layers with ReLU (each max-pooled when ``config.pool``
    > 1), then FC 328 -> FC 192 -> classes, with dropout before the last layer. Input
    (B, C, H, W); output logits (B, classes), float32. ``compute_dtype`` (None: float32) is
    the autocast dtype of the whole network; the convolutions' implementation is chosen
    like CapsNet's (:mod:`capsnet.tuning`)."""

    def __init__(self, config: CNNConfig = CNNConfig()):
        super().__init__()
        cfg = self.config = config
        convs: list[nn.Module] = []
        channels = (cfg.in_channels, *cfg.conv_channels)
        for c_in, c_out in zip(channels[:-1], channels[1:], strict=False):
            convs += [GemmConv2d(c_in, c_out, cfg.conv_kernel, padding=cfg.conv_kernel // 2),
                      nn.ReLU(inplace=True)]
            if cfg.pool > 1:
                convs.append(nn.MaxPool2d(cfg.pool))
        self.features = nn.Sequential(*convs)
        sizes = (cfg.conv_channels[-1] * cfg.feature_grid**2, *cfg.fc_hidden)
        fcs: list[nn.Module] = []
        for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=False):
            fcs += [nn.Linear(n_in, n_out), nn.ReLU(inplace=True)]
        self.classifier = nn.Sequential(*fcs, nn.Dropout(cfg.dropout),
                                        nn.Linear(sizes[-1], cfg.num_classes))
        self.decoder = None
        if cfg.decoder != "none":  # Qin et al. 2020: CNN+R, CNN+CR
            slots = cfg.num_classes if cfg.decoder == "class-conditional" else 1
            self.decoder = Decoder(slots, sizes[-1], cfg.decoder_hidden,
                                   (cfg.in_channels, cfg.image_size, cfg.image_size))
        self.compute_dtype: torch.dtype | None = None

    def forward(self, x: torch.Tensor,
                labels: torch.Tensor | None = None) -> torch.Tensor | CNNOutput:
        """Logits (B, classes); with a decoder a :class:`CNNOutput`, whose reconstruction is
        fed the last hidden layer (class-conditional: in the slot of ``labels``, else of the
        predicted class)."""
        with autocast_to(x.device, self.compute_dtype):
            h = self.features(x)  # (B, 128, 28, 28)
            hidden = self.classifier[:-1](h.flatten(1))  # (B, 192)
            logits = full_precision(self.classifier[-1](hidden))  # (B, 10)
            if self.decoder is None:
                return logits
            keep = labels if labels is not None else logits.argmax(dim=-1)  # (B,)
            if self.config.decoder == "class-conditional":
                poses = hidden.unsqueeze(1).expand(-1, self.config.num_classes, -1)  # (B, J, 192)
            else:  # one slot, always kept
                poses, keep = hidden.unsqueeze(1), torch.zeros_like(keep)  # (B, 1, 192)
            return CNNOutput(logits, full_precision(self.decoder(poses, keep)))
