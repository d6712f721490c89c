"""Models by one name, as timm names them: ``list_models()`` and ``create_model(name)``.

    >>> from capsnet.hub import create_model, list_models
    >>> list_models()[:4]  # ['capsnet', 'capsnet-cifar10', 'capsnet-half', 'capsnet-small']
    >>> model = create_model("em-small", routing_iterations=2)  # fresh, options checked
    >>> model = create_model("capsnet", pretrained=True)  # trained (capsnet.pretrained)

A name is a registered model ('capsnet', 'cnn', 'efficient', 'em': the paper's sizes) or
MODEL-PRESET for another preset ('capsnet-small', 'cnn-tiny'). This module sits above the
registry (capsnet.models.registry) and the trained weights (capsnet.pretrained), so neither
of those imports the other.
"""
from __future__ import annotations

from torch import nn

from capsnet.config import ConfigError
from capsnet.models.registry import MODELS, PAPER, build_model, make_config
from capsnet.pretrained import load_pretrained, pretrained_names


def split_name(name: str) -> tuple[str, str]:
    """'capsnet' -> ('capsnet', 'paper'); 'em-small' -> ('em', 'small')."""
    model, _, preset = name.partition("-")
    return model, preset or PAPER


def list_models(pretrained: bool | None = None) -> list[str]:
    """The names :func:`create_model` takes: 'capsnet', 'cnn', 'efficient', 'em' for the
    paper's sizes and MODEL-PRESET (e.g. 'capsnet-small', 'cnn-tiny') for the others;
    with ``pretrained`` True only the names with trained weights (capsnet.pretrained)."""
    if pretrained:
        return sorted(pretrained_names())
    return sorted(name if preset == PAPER else f"{name}-{preset}"
                  for name, entry in MODELS.items() for preset in entry.presets)


def create_model(name: str, pretrained: bool = False, **overrides) -> nn.Module:
    """A model by :func:`list_models` name: fresh, with ``overrides`` of its config
    (checked strictly, as :func:`~capsnet.models.registry.make_config`), or with
    ``pretrained`` True the trained one (capsnet.pretrained.load_pretrained)."""
    if pretrained:
        if overrides:
            raise ConfigError(f"a pretrained model takes no config overrides "
                              f"(given: {', '.join(overrides)})")
        return load_pretrained(name)
    model, preset = split_name(name)
    if model not in MODELS or preset not in MODELS[model].presets:
        raise ConfigError(f"unknown model name {name!r}; choose from {', '.join(list_models())}")
    return build_model(make_config(model, preset, **overrides))
