"""What the registry knows of a model, declared in its file (config, presets, training
defaults, routing view, export, data initialisation), and what a capsule model's forward
hands to tools that look inside it: :class:`ClassRouting` and :class:`Children`."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn

TYPE_MAJOR, POSITION_MAJOR = "type-major", "position-major"


@dataclass(frozen=True)
class ModelEntry:
    """One model, as the registry, the CLI, training, tracing and export see it."""

    name: str  # the --model choice and the checkpoint's "model"
    config: type  # its config dataclass (a capsnet.config.DataConfig, in the model's file)
    model: Callable[[Any], nn.Module]  # config -> a fresh model
    summary: str  # one line for --model's help
    presets: dict[str, dict]  # preset name -> config values ('paper': the defaults)
    lr: float  # Adam rate of the paper recipe (recipes scale it by lr_scale)
    preset_lr: dict[str, float] = field(default_factory=dict)  # presets with another rate
    # recipe name -> its fields changed for this model (capsnet.training.settings.RECIPES)
    recipes: dict[str, dict] = field(default_factory=dict)
    # the config's values (defaults, preset, options) and the option names a caller gave ->
    # ConfigError for a combination the model cannot honour (unknown options are refused before)
    check: Callable[[dict, set[str]], None] | None = None
    # config -> where the class capsules' children sit; None: the model does not route
    # (the model then has no forward_routing)
    routing_view: Callable[[Any], Children] | None = None
    # model, images (B, C, H, W) in [0, 1] -> what it did: a fresh model's data-dependent
    # initialisation before training (never on a resumed one)
    initialise: Callable[[nn.Module, torch.Tensor], str] | None = None
    scores: str = "lengths"  # what the class scores are called in exported files
    onnx_opset: int | None = None  # None: capsnet.export's default

    def lr_for(self, preset: str) -> float:
        return self.preset_lr.get(preset, self.lr)


@dataclass(frozen=True)
class Children:
    """The children of the class-capsule layer: ``types`` on a G x G grid in ``order``,
    each row/column's receptive-field centre and side, the layer's name and strength kind."""

    types: int
    grid: int
    order: str
    centres: list[float]
    field: int
    name: str  # "primary" (CapsNet, Efficient-CapsNet) or "ConvCaps2" (EM)
    strength: str  # "length" or "activation"

    def on_grid(self, per_child: torch.Tensor) -> torch.Tensor:
        """(..., I) over the children -> (..., types, G, G)."""
        if self.order == TYPE_MAJOR:
            return per_child.unflatten(-1, (self.types, self.grid, self.grid))
        return per_child.unflatten(-1, (self.grid, self.grid, self.types)).movedim(-1, -3)


class ClassRouting(NamedTuple):
    """A capsule model's forward up to its class capsules (``forward_routing``), float32."""

    children: torch.Tensor  # (B, I, D) vector capsules; EM: its (B, I) activations
    votes: torch.Tensor  # (B, J, I, D) each child's vote for each class capsule
    activations: torch.Tensor | None  # (B, I) the router's child activations, None: none
    routed: Any  # capsnet.routing.Routed: poses (B, J, D), activations (B, J), couplings
    router: nn.Module  # the capsnet.routing.Router that routed them
