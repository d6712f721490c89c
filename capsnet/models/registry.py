"""The one registry of models: a plain dict, one line per model, each entry declared in its
model's file. ``make_config("em", "small", routing_iterations=2)``."""
from __future__ import annotations

from torch import nn

from capsnet.config import ConfigError, check_known, field_defaults, field_names
from capsnet.models import capsnet, cnn_baseline, efficient_capsnet, em_capsnet
from capsnet.models.entry import ModelEntry

MODELS: dict[str, ModelEntry] = {
    "capsnet": capsnet.ENTRY,
    "cnn": cnn_baseline.ENTRY,
    "efficient": efficient_capsnet.ENTRY,
    "em": em_capsnet.ENTRY,
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


def check_options(model: str, preset: str = PAPER, **options) -> None:
    """ConfigError naming the valid choices for an unknown model or preset, or an option
    the model lacks or cannot honour with the others."""
    entry = model_entry(model)
    if preset not in entry.presets:
        raise ConfigError(f"unknown preset {preset!r} for {model}; choose from "
                          f"{', '.join(entry.presets)}")
    check_known(model, entry.config, options)
    if entry.check is not None:
        values = {**field_defaults(entry.config), **entry.presets[preset], **options}
        entry.check(values, set(options))


def make_config(model: str, preset: str = PAPER, **overrides):
    """Config for ``model`` from a named preset plus ``overrides``, checked strictly."""
    check_options(model, preset, **overrides)
    return MODELS[model].config(**{**MODELS[model].presets[preset], **overrides})


def config_from_dict(model: str, values: dict):
    """The config a checkpoint saved; unknown keys are an error."""
    entry = model_entry(model)
    check_known(model, entry.config, values)
    return entry.config(**values)


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


def has_option(model: str, option: str) -> bool:
    """Whether ``model``'s config has the field ``option``."""
    return option in field_names(model_entry(model).config)
