"""Model assemblies and the few functions that treat every model alike."""
from __future__ import annotations

import torch
from torch import nn

from capsnet.config import CapsNetConfig, CNNConfig, EfficientCapsNetConfig, EMCapsNetConfig
from capsnet.models.capsnet import CapsNet, CapsuleOutput
from capsnet.models.cnn_baseline import CNNBaseline, CNNOutput
from capsnet.models.efficient_capsnet import EfficientCapsNet
from capsnet.models.em_capsnet import EMCapsNet, MatrixCapsuleOutput

MODELS = {"capsnet": CapsNet, "cnn": CNNBaseline, "efficient": EfficientCapsNet,
          "em": EMCapsNet}


def model_name_of(config) -> str:
    """'capsnet', 'cnn', 'efficient' or 'em' for a config object."""
    if isinstance(config, CapsNetConfig):
        return "capsnet"
    if isinstance(config, CNNConfig):
        return "cnn"
    if isinstance(config, EfficientCapsNetConfig):
        return "efficient"
    if isinstance(config, EMCapsNetConfig):
        return "em"
    raise TypeError(f"not a model config: {type(config).__name__}")


def build_model(config) -> nn.Module:
    """A fresh model for a :class:`CapsNetConfig`, :class:`CNNConfig` or
    :class:`EfficientCapsNetConfig` or :class:`EMCapsNetConfig`."""
    return MODELS[model_name_of(config)](config)


def class_scores(output) -> torch.Tensor:
    """Per-class scores (B, J) of any model's output: capsule lengths or softmax probabilities."""
    if isinstance(output, CapsuleOutput):
        return output.lengths
    if isinstance(output, CNNOutput):
        output = output.logits
    return torch.softmax(output.float(), dim=-1)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside DistributedDataParallel / torch.compile wrappers."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["CapsNet", "CapsuleOutput", "CNNBaseline", "CNNOutput", "EfficientCapsNet", "EMCapsNet",
           "MatrixCapsuleOutput", "MODELS", "build_model", "class_scores", "count_parameters",
           "model_name_of", "unwrap"]
