"""Trained models by name (kept small: the names with weights shipped in the package)."""
from __future__ import annotations

from torch import nn

from capsnet.checkpoint import DEFAULT_WEIGHTS, load_model

SHIPPED = {"capsnet": DEFAULT_WEIGHTS}  # name -> weights file


def pretrained_names() -> list[str]:
    return sorted(name for name, path in SHIPPED.items() if path.is_file())


def load_pretrained(name: str) -> nn.Module:
    """The trained model ``name`` in eval mode on the CPU; ValueError naming the choices."""
    if name not in pretrained_names():
        raise ValueError(f"no pretrained model {name!r}; choose from "
                         f"{', '.join(pretrained_names()) or 'none (no weights installed)'}")
    return load_model(SHIPPED[name])
