"""What every model shares: its registry entry (:class:`ModelEntry`, declared in its file),
what a capsule model's ``forward_routing`` hands to tools that look inside it
(:class:`ClassRouting`, :class:`Children`), and the precision it runs in.

A model carries its ``compute_dtype`` (None: float32) and runs its convolutions and decoder
under :func:`autocast_to` that dtype; routing, squash and the losses stay in float32. fp16
(GPUs without native bf16) trains with gradient scaling: its 5 exponent bits would flush
small gradients to zero."""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn

TYPE_MAJOR, POSITION_MAJOR = "type-major", "position-major"
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16,
                                             "fp16": torch.float16}


def precision_name(dtype: torch.dtype | None) -> str:
    """'fp32', 'bf16' or 'fp16' for a compute dtype (None is float32)."""
    return next(name for name, d in PRECISIONS.items() if d == dtype)


def autocast_to(device: torch.device | str, dtype: torch.dtype | None):
    """Autocast context for ``dtype`` on ``device``, or a no-op when dtype is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def grad_scaler_for(device: torch.device | str, dtype: torch.dtype | None):
    """A ``torch.amp.GradScaler`` for training in fp16 on ``device``; None for the other
    precisions, which need none."""
    if dtype != torch.float16:
        return None
    return torch.amp.GradScaler(torch.device(device).type)


class ModelOutput(NamedTuple):
    """What every model returns: class scores, and what else the model has.

    ``loss`` names the training loss (its registry entry's: "margin", "spread" or
    "cross_entropy"), so ``capsnet.losses.model_loss`` needs only the output."""

    scores: torch.Tensor  # (B, J) capsule lengths or activations, a CNN's softmax probabilities
    poses: torch.Tensor | None = None  # (B, J, D) the class capsules' poses; None: no capsules
    reconstructions: torch.Tensor | None = None  # (B, C, H, W); None: no decoder
    logits: torch.Tensor | None = None  # (B, J) a CNN's scores before the softmax
    loss: str = "margin"

    @classmethod
    def from_logits(cls, logits: torch.Tensor, reconstructions: torch.Tensor | None = None,
                    loss: str = "cross_entropy") -> ModelOutput:
        """A classifier's output from its logits (B, J): the scores are their softmax."""
        return cls(torch.softmax(logits.float(), dim=-1), None, reconstructions, logits, loss)

    @property
    def lengths(self) -> torch.Tensor:
        """Deprecated (one release): ``scores``."""
        return _deprecated(self, "lengths")

    @property
    def activations(self) -> torch.Tensor:
        """Deprecated (one release): ``scores``."""
        return _deprecated(self, "activations")


def _deprecated(output: ModelOutput, name: str) -> torch.Tensor:
    warnings.warn(f"ModelOutput.{name} is deprecated; use .scores (every model has it)",
                  DeprecationWarning, stacklevel=3)
    return output.scores


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
    loss: str = "margin"  # its training loss (its ModelOutput's ``loss``, see capsnet.losses)

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
