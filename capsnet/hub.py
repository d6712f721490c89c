"""Models by name, as timm's ``create_model`` makes them: ``MODEL`` at the paper's sizes
('capsnet', 'cnn', 'efficient', 'em') or ``MODEL-PRESET`` ('capsnet-small', 'em-small',
'cnn-half', 'cnn-tiny', ...: :data:`capsnet.config.PRESETS`), with trained weights where
:mod:`capsnet.pretrained` has them.

    >>> import capsnet
    >>> model = capsnet.create_model("capsnet", pretrained=True)  # eval mode, 99.67% MNIST
    >>> fresh = capsnet.create_model("capsnet-small", num_classes=5, image_size=32)
"""
from __future__ import annotations

import dataclasses

from torch import nn

from capsnet.config import MODEL_CONFIGS, PRESETS, make_config
from capsnet.models import build_model
from capsnet.pretrained import load_pretrained, pretrained_names

PAPER = "paper"
SEPARATOR = "-"


def list_models(pretrained: bool | None = None) -> list[str]:
    """Every name :func:`create_model` takes, sorted; ``pretrained`` True: only those with
    trained weights, False: only those without."""
    names = [model if preset == PAPER else f"{model}{SEPARATOR}{preset}"
             for preset, sizes in PRESETS.items() for model in sizes]
    with_weights = set(pretrained_names())
    if pretrained is not None:
        names = [name for name in names if (name in with_weights) == pretrained]
    return sorted(names)


def split_name(name: str) -> tuple[str, str]:
    """'cnn-half' -> ('cnn', 'half'); 'capsnet' -> ('capsnet', 'paper'). ValueError naming
    the choices for a name :func:`list_models` does not list."""
    if name not in list_models():
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(list_models())}")
    model, _, preset = name.partition(SEPARATOR)
    return model, preset or PAPER


def create_model(name: str, pretrained: bool = False, **overrides) -> nn.Module:
    """A model by name (:func:`list_models`). ``pretrained``: its trained weights, in eval
    mode (:func:`capsnet.pretrained.load_pretrained`); otherwise a fresh model in training
    mode whose config fields ``overrides`` sets (num_classes=5, image_size=64,
    in_channels=3, routing_iterations=1, ...). An unknown field is a ValueError naming the
    valid ones; trained weights take none."""
    model, preset = split_name(name)
    valid = [field.name for field in dataclasses.fields(MODEL_CONFIGS[model])]
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        raise ValueError(f"unknown {model} config field(s) {', '.join(unknown)}; valid: "
                         f"{', '.join(valid)}")
    if pretrained:
        if overrides:
            raise ValueError(f"trained weights fix {name!r}'s config: create_model({name!r}, "
                             f"pretrained=True) takes no overrides, got "
                             f"{', '.join(sorted(overrides))}")
        return load_pretrained(name)
    return build_model(make_config(model, preset, **overrides))
