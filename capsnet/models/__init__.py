"""Model assemblies and their one registry: a plain dict, one line per model, each entry
declared in its model's file (``make_config("em", "small", routing_iterations=2)``), and
the few functions that treat every model alike."""
from __future__ import annotations

import dataclasses
import warnings

import torch
from torch import nn

from capsnet.config import ConfigError
from capsnet.models import (
    capsnet,
    capsule_head,
    cnn_baseline,
    efficient_capsnet,
    em_capsnet,
    stem_cnn,
)
from capsnet.models.base import ClassRouting, ModelEntry, ModelOutput
from capsnet.models.capsnet import CapsNet, CapsNetConfig
from capsnet.models.cnn_baseline import CNNBaseline, CNNConfig
from capsnet.models.efficient_capsnet import EfficientCapsNet, EfficientCapsNetConfig
from capsnet.models.em_capsnet import EMCapsNet, EMCapsNetConfig

MODELS: dict[str, ModelEntry] = {
    "capsnet": capsnet.ENTRY,
    "cnn": cnn_baseline.ENTRY,
    "efficient": efficient_capsnet.ENTRY,
    "em": em_capsnet.ENTRY,
    "capshead": capsule_head.ENTRY,
    "stemcnn": stem_cnn.ENTRY,
}

PAPER = "paper"  # the preset a bare model name means
# Training crops a preset asks for (random crops in training, the centre crop in evaluation).
PRESET_CROPS: dict[str, int] = {"cifar10": 24}


def model_entry(name: str) -> ModelEntry:
    """The registry's entry for ``name``; ConfigError naming the models otherwise."""
    if name not in MODELS:
        raise ConfigError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return MODELS[name]


def preset_names() -> list[str]:
    """Every preset some model has."""
    return sorted({preset for entry in MODELS.values() for preset in entry.presets})


def has_option(model: str, option: str) -> bool:
    """Whether ``model``'s config has the field ``option``."""
    return option in {f.name for f in dataclasses.fields(model_entry(model).config)}


def check_known(model: str, keys) -> None:
    """ConfigError naming the unknown keys and the valid ones, if any key is not an option."""
    known = [f.name for f in dataclasses.fields(model_entry(model).config)]
    unknown = sorted(set(keys) - set(known))
    if unknown:
        raise ConfigError(f"unknown option {', '.join(map(repr, unknown))} for {model}; "
                          f"choose from {', '.join(known)}")


def check_options(model: str, preset: str = PAPER, **options) -> None:
    """ConfigError naming the valid choices for an unknown model or preset, or an option
    the model lacks or cannot honour with the others."""
    entry = model_entry(model)
    if preset not in entry.presets:
        raise ConfigError(f"unknown preset {preset!r} for {model}; choose from "
                          f"{', '.join(entry.presets)}")
    check_known(model, options)
    if entry.check is not None:
        defaults = {f.name: f.default for f in dataclasses.fields(entry.config)}
        entry.check({**defaults, **entry.presets[preset], **options}, set(options))


def make_config(model: str, preset: str = PAPER, **overrides):
    """Config for ``model`` from a named preset plus ``overrides``, checked strictly."""
    check_options(model, preset, **overrides)
    return MODELS[model].config(**{**MODELS[model].presets[preset], **overrides})


def config_from_dict(model: str, values: dict):
    """The config a checkpoint saved; unknown keys are an error."""
    check_known(model, values)
    return MODELS[model].config(**values)


def entry_of(config) -> ModelEntry:
    """The entry whose config class ``config`` is; TypeError for anything else."""
    for entry in MODELS.values():
        if type(config) is entry.config:
            return entry
    raise TypeError(f"not a model config: {type(config).__name__}")


def model_name_of(config) -> str:
    """'capsnet', 'cnn', 'efficient' or 'em' for a config object."""
    return entry_of(config).name


def build_model(config) -> nn.Module:
    """A fresh model for a config of any registered model."""
    return entry_of(config).model(config)


def class_scores(output: ModelOutput) -> torch.Tensor:
    """Per-class scores (B, J) of any model's output (``output.scores``): the class capsules'
    lengths (CapsNet, Efficient-CapsNet), their activations (EM) or a CNN's probabilities."""
    return output.scores


# The output types before ModelOutput (0.2.0): deprecated aliases, for one release.
DEPRECATED_OUTPUTS = ("CapsuleOutput", "CNNOutput", "MatrixCapsuleOutput")


def __getattr__(name: str):
    if name in DEPRECATED_OUTPUTS:
        warnings.warn(f"capsnet.models.{name} is deprecated; every model returns ModelOutput",
                      DeprecationWarning, stacklevel=2)
        return ModelOutput
    raise AttributeError(f"module 'capsnet.models' has no attribute {name!r}")


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside DistributedDataParallel / torch.compile wrappers."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["CapsNet", "CapsNetConfig", "CNNConfig", "EfficientCapsNetConfig", "EMCapsNetConfig",
           "ClassRouting", "CNNBaseline", "EfficientCapsNet", "EMCapsNet", "MODELS",
           "ModelEntry", "ModelOutput", "PAPER", "PRESET_CROPS",
           "build_model", "check_options", "class_scores", "config_from_dict", "count_parameters",
           "entry_of", "has_option", "make_config", "model_entry", "model_name_of",
           "preset_names", "unwrap"]
