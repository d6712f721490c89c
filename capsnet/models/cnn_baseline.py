"""The paper's baseline CNN (Sabour et al. 2017, section 5): about 35.4M parameters."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from capsnet.config import ConfigError, NormalisedDataConfig
from capsnet.layers import Decoder, GemmConv2d, InputNorm, full_precision, squash
from capsnet.models.base import ModelEntry, ModelOutput, autocast_to

CNN_DECODERS = ("none", "plain", "class-conditional")
# "linear": logits, cross-entropy (the paper's baseline); "capsules": the last layer gives
# one vector a class, squashed, its length the class score, trained with the margin loss (the
# control Gu, Tresp & Hu 2021 suggest: a CNN with CapsNet's output, without routing).
CNN_HEADS = ("linear", "capsules")


@dataclass(frozen=True)
class CNNConfig(NormalisedDataConfig):
    """The paper's baseline CNN: three 5x5 convolutions, FC 328, FC 192, dropout; ``pool`` > 1
    max-pools after every convolution (the ``tiny`` preset). ``input_norm`` stays 'none' (raw
    pixels) unless asked for, whatever the data."""

    conv_channels: tuple[int, ...] = (256, 256, 128)
    conv_kernel: int = 5
    pool: int = 1
    fc_hidden: tuple[int, ...] = (328, 192)
    dropout: float = 0.5
    # A reconstruction decoder fed the last hidden layer (Qin et al. 2020): "none", "plain"
    # (CNN+R) or "class-conditional" (CNN+CR: the features in the predicted class's slot).
    decoder: str = "none"
    decoder_hidden: tuple[int, ...] = (512, 1024)
    head: str = "linear"  # CNN_HEADS
    capsule_dim: int = 16  # head "capsules": each class's vector (CapsNet's DigitCaps' 16)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.decoder not in CNN_DECODERS:
            raise ValueError(f"unknown CNN decoder {self.decoder!r}; choose from "
                             f"{', '.join(CNN_DECODERS)}")
        if self.head not in CNN_HEADS:
            raise ValueError(f"unknown CNN head {self.head!r}; choose from {', '.join(CNN_HEADS)}")
        if self.feature_grid < 1:
            raise ValueError(f"image size {self.image_size} is too small for "
                              f"{len(self.conv_channels)} poolings by {self.pool}")

    @property
    def feature_grid(self) -> int:
        """Side of the last convolution's output (the image's side without pooling)."""
        return self.image_size // self.pool ** len(self.conv_channels)


class ClassCapsules(nn.Module):
    """A linear layer whose output is one squashed ``dim``-vector a class, float32:
    (B, F) -> (B, classes, dim), each vector's length in [0, 1) its class score."""

    def __init__(self, in_features: int, classes: int, dim: int):
        super().__init__()
        self.classes, self.dim = classes, dim
        self.linear = nn.Linear(in_features, classes * dim)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        s = full_precision(self.linear(hidden)).unflatten(-1, (self.classes, self.dim))  # (B, J, D)
        return squash(s)  # (B, J, D)


class CNNBaseline(nn.Module):
    """(B, C, H, W) -> a :class:`ModelOutput`, float32: with the linear head softmax
    probabilities (B, classes) as scores and the logits; with the capsule head the class
    vectors' lengths (B, classes) as scores and the vectors (B, classes, D) as poses, trained
    with the margin loss. ``compute_dtype`` is the autocast dtype."""

    def __init__(self, config: CNNConfig = CNNConfig()):
        super().__init__()
        cfg = self.config = config
        self.input_norm = InputNorm(cfg.input_norm)  # no parameters
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
        head = (ClassCapsules(sizes[-1], cfg.num_classes, cfg.capsule_dim)
                if cfg.head == "capsules" else nn.Linear(sizes[-1], cfg.num_classes))
        self.classifier = nn.Sequential(*fcs, nn.Dropout(cfg.dropout), head)
        self.decoder = None
        if cfg.decoder != "none":  # Qin et al. 2020: CNN+R, CNN+CR
            slots = cfg.num_classes if cfg.decoder == "class-conditional" else 1
            self.decoder = Decoder(slots, sizes[-1], cfg.decoder_hidden,
                                   (cfg.in_channels, cfg.image_size, cfg.image_size))
        self.compute_dtype: torch.dtype | None = None

    def forward(self, x: torch.Tensor,
                labels: torch.Tensor | None = None) -> ModelOutput:
        """Scores and logits (capsule head: lengths and poses); with a decoder also
        reconstructions, the decoder fed the last hidden layer (class-conditional: in the slot
        of ``labels``, else of the predicted class)."""
        with autocast_to(x.device, self.compute_dtype):
            h = self.features(self.input_norm(x))  # (B, 128, 28, 28)
            hidden = self.classifier[:-1](h.flatten(1))  # (B, 192)
            if self.config.head == "capsules":
                poses = self.classifier[-1](hidden)  # (B, 10, 16) float32, squashed
                lengths = torch.linalg.vector_norm(poses, dim=-1)  # (B, 10)
                return ModelOutput(lengths, poses, loss=CAPSULE_HEAD_LOSS)
            logits = full_precision(self.classifier[-1](hidden))  # (B, 10)
            if self.decoder is None:
                return ModelOutput.from_logits(logits, loss=ENTRY.loss)
            keep = labels if labels is not None else logits.argmax(dim=-1)  # (B,)
            if self.config.decoder == "class-conditional":
                poses = hidden.unsqueeze(1).expand(-1, self.config.num_classes, -1)  # (B, J, 192)
            else:  # one slot, always kept
                poses, keep = hidden.unsqueeze(1), torch.zeros_like(keep)  # (B, 1, 192)
            reconstructions = full_precision(self.decoder(poses, keep))  # (B, C, H, W)
            return ModelOutput.from_logits(logits, reconstructions, loss=ENTRY.loss)


CAPSULE_HEAD_LOSS = "margin"  # capsnet.losses: the capsule head's training loss


def check_cnn(values: dict, given: set[str]) -> None:
    """ConfigError for the capsule head with a decoder (the decoders read the linear head's
    hidden layer; no capsule-head decoder is built)."""
    if values["head"] == "capsules" and values["decoder"] != "none":
        raise ConfigError(f"the CNN's capsule head takes no decoder (given: {values['decoder']!r});"
                          f" use --cnn-decoder none or --cnn-head linear")


ENTRY = ModelEntry(
    name="cnn", config=CNNConfig, model=CNNBaseline, summary="its CNN baseline",
    presets={
        "paper": {},
        "small": {"conv_channels": (16, 16, 8), "fc_hidden": (32, 24)},
        # A plain small CNN to measure CapsNet against on own data: two 5x5 convolutions
        # (16, 32) each followed by 2x2 max-pooling, FC 64 (0.11M parameters at 28x28,
        # 0.15M for 32x32 RGB).
        "tiny": {"conv_channels": (16, 32), "pool": 2, "fc_hidden": (64,), "dropout": 0.25},
        # Half the paper's channels, the paper's FC sizes: on the affNIST 40x40 canvas the
        # CNN has about the paper CNN's 28x28 parameter count (the full one has twice as many).
        "half": {"conv_channels": (128, 128, 64)},
        "cifar10": {},
        "svhn": {},
    },
    # The wide CNNs stay at chance at the paper's 1e-3; the 'small' and 'tiny' ones learn.
    lr=1e-4,
    preset_lr={"small": 1e-3, "tiny": 1e-3},
    check=check_cnn,
    loss="cross_entropy",  # the linear head's; the capsule head's output names CAPSULE_HEAD_LOSS
)
