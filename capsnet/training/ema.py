"""An exponential moving average (EMA) of a model's weights, updated after every optimiser step.

    ema <- d * ema + (1 - d) * weights,  d = decay, or min(decay, (1 + n) / (10 + n)) with warm-up

It starts from the model's initial weights; floating-point buffers are averaged, others
copied. Not AveragedModel: the warm-up needs the update count, and the average is saved as
a plain model state_dict."""
from __future__ import annotations

import copy
import itertools

import torch
from torch import nn

from capsnet.models import unwrap


class WeightEMA:
    """The moving average of ``model``'s weights, as a model of its own (``.module``)."""

    def __init__(self, model: nn.Module, decay: float, warmup: bool = True):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), not {decay}")
        self.module = copy.deepcopy(unwrap(model)).eval().requires_grad_(False)
        self.decay, self.warmup, self.updates = decay, warmup, 0

    def decay_at(self, update: int) -> float:
        """The decay of the ``update``-th (0-based) update."""
        return min(self.decay, (1 + update) / (10 + update)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the average towards ``model``'s current weights (the model it was made of)."""
        weight = 1.0 - self.decay_at(self.updates)
        for average, current in zip(_tensors(self.module), _tensors(unwrap(model)), strict=True):
            if average.is_floating_point():
                average.lerp_(current.detach(), weight)
            else:
                average.copy_(current)
        self.updates += 1

    def state(self) -> dict:
        """Everything but the weights, for a checkpoint (the weights are ``module``'s)."""
        return {"decay": self.decay, "warmup": self.warmup, "updates": self.updates}

    def load(self, weights: dict, state: dict) -> None:
        """Inverse of saving ``module.state_dict()`` and :meth:`state`."""
        self.module.load_state_dict(weights)
        self.decay, self.warmup, self.updates = state["decay"], state["warmup"], state["updates"]


def _tensors(model: nn.Module):
    """Parameters, then buffers, in registration order (the same for a deep copy)."""
    return itertools.chain(model.parameters(), model.buffers())
