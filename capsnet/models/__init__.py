"""Model assemblies, their registry (:mod:`capsnet.models.registry`) and the few functions
that treat every model alike."""
from __future__ import annotations

import torch
from torch import nn

from capsnet.models.capsnet import CapsNet, CapsNetConfig, CapsuleOutput
from capsnet.models.cnn_baseline import CNNBaseline, CNNConfig, CNNOutput
from capsnet.models.efficient_capsnet import EfficientCapsNet, EfficientCapsNetConfig
from capsnet.models.em_capsnet import EMCapsNet, EMCapsNetConfig, MatrixCapsuleOutput
from capsnet.models.entry import ClassRouting, ModelEntry
from capsnet.models.registry import (
    MODELS,
    PRESET_CROPS,
    build_model,
    config_from_dict,
    entry_of,
    make_config,
    model_entry,
    model_name_of,
    preset_names,
)


def class_scores(output) -> torch.Tensor:
    """Per-class scores (B, J) of any model's output: the class capsules' lengths (CapsNet,
    Efficient-CapsNet), their activations (the EM model) or the softmax of the logits (CNN)."""
    if isinstance(output, CapsuleOutput):
        return output.lengths
    if isinstance(output, MatrixCapsuleOutput):
        return output.activations
    if isinstance(output, CNNOutput):
        output = output.logits
    return torch.softmax(output.float(), dim=-1)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside DistributedDataParallel / torch.compile wrappers."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["CapsNet", "CapsNetConfig", "CNNConfig", "EfficientCapsNetConfig", "EMCapsNetConfig",
           "CapsuleOutput", "ClassRouting", "CNNBaseline", "CNNOutput", "EfficientCapsNet",
           "EMCapsNet", "MatrixCapsuleOutput", "MODELS", "ModelEntry", "PRESET_CROPS",
           "build_model", "class_scores", "config_from_dict", "count_parameters",
           "entry_of", "make_config", "model_entry",
           "model_name_of", "preset_names", "unwrap"]
