"""Models by one name, as timm names them: ``list_models()`` and ``create_model(name)``.

    >>> model = create_model("em-small", routing_iterations=2)  # fresh, options checked
    >>> model = create_model("capsnet", pretrained=True)  # trained (capsnet.pretrained)

A name is a registered model (the paper's sizes) or MODEL-PRESET ('capsnet-small'). This
module sits above the registry and the trained weights, so neither imports the other."""
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
    """The names :func:`create_model` takes (with ``pretrained``: those with trained weights)."""
    if pretrained:
        return sorted(pretrained_names())
    return sorted(name if preset == PAPER else f"{name}-{preset}"
                  for name, entry in MODELS.items() for preset in entry.presets)


def create_model(name: str, pretrained: bool = False, **overrides) -> nn.Module:
    """A model by :func:`list_models` name: fresh with checked config ``overrides``, or trained."""
    if pretrained:
        if overrides:
            raise ConfigError(f"a pretrained model takes no config overrides "
                              f"(given: {', '.join(overrides)})")
        return load_pretrained(name)
    model, preset = split_name(name)
    if model not in MODELS or preset not in MODELS[model].presets:
        raise ConfigError(f"unknown model name {name!r}; choose from {', '.join(list_models())}")
    return build_model(make_config(model, preset, **overrides))
