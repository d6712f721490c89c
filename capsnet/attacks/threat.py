"""The objective an attack maximises and how success is judged: :class:`Objective`.

White-box: gradients and success both come from the attacked model. Surrogate (the vote
attack): the loss is computed on ``surrogate(x)``, success on the model. Transfer: the
objective is built on the source model and its adversarial images are then shown to the
target. Everything runs in float32 with autocast off (:func:`prepare_for_attack`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from capsnet.attacks.objectives import AttackLoss, reconstruction_error
from capsnet.models import class_scores


def prepare_for_attack(model: nn.Module, full_routing_gradient: bool = True) -> nn.Module:
    """The model in eval mode, float32 (``compute_dtype`` None: no autocast), with its
    parameters frozen (attacks need input gradients only) and gradients through every
    routing iteration: dynamic routing trains with the earlier iterations' couplings
    detached (``full_graph`` False), which would hide part of the input gradient from an
    attack; the outputs are the same (``full_routing_gradient`` False keeps the training
    graph, to measure what the detached path costs an attack). Returns the same module."""
    model.eval()
    if hasattr(model, "compute_dtype"):
        model.compute_dtype = None
    model.requires_grad_(False)
    for module in model.modules():
        if hasattr(module, "full_graph"):
            module.full_graph = full_routing_gradient
    return model


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor, batch_size: int = 250) -> torch.Tensor:
    """(N,) predicted classes of images x (N, C, H, W) in [0, 1]."""
    return torch.cat([class_scores(model(b)).argmax(-1) for b in x.split(batch_size)])


def random_targets(labels: torch.Tensor, num_classes: int,
                   generator: torch.Generator | None) -> torch.Tensor:
    """(B,) a seeded random class other than each label, for targeted attacks."""
    shift = torch.randint(1, num_classes, labels.shape, generator=generator,
                          device=labels.device)
    return (labels + shift) % num_classes


@dataclasses.dataclass(frozen=True)
class Objective:
    """Called on adversarial images (B, C, H, W) (requiring grad or not), returns the loss
    to maximise (B,) and whether each image fools ``model`` (B,) bool: classified other
    than ``labels`` (untargeted), or as ``labels`` (targeted: then they are the targets).

    ``surrogate`` (x -> output) gives the output the loss reads (default: the model's);
    ``reconstruction_weight`` > 0 subtracts that multiple of the reconstruction error of
    the winning capsule (the reconstructive attack of Qin et al. 2020: the image must also
    reconstruct well, to pass a reconstruction-based detector)."""

    model: nn.Module
    labels: torch.Tensor  # (B,)
    loss: AttackLoss
    targeted: bool = False
    surrogate: Callable[[torch.Tensor], object] | None = None
    reconstruction_weight: float = 0.0

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(device_type=x.device.type, enabled=False):
            if self.surrogate is None:
                output = attacked = self.model(x)
            else:
                output = self.surrogate(x)
                with torch.no_grad():
                    attacked = self.model(x)
            loss = self.loss(output, self.labels, self.targeted)  # (B,)
            if self.reconstruction_weight > 0:
                loss = loss - self.reconstruction_weight * reconstruction_error(output, x)
        predicted = class_scores(attacked).detach().argmax(-1)  # (B,)
        fooled = predicted == self.labels if self.targeted else predicted != self.labels
        return loss, fooled

    def restricted(self, idx: torch.Tensor) -> Objective:
        """The same objective for the examples ``idx`` (K,) of the batch."""
        return dataclasses.replace(self, labels=self.labels[idx])
