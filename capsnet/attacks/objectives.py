"""What an attack maximises, for every model alike: losses on the class scores (capsule
lengths or activations, CNN logits), each (B,), larger = further from the labels; and the
:class:`Objective` an attack climbs, which also judges its success."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from capsnet.losses import LAMBDA, M_MINUS, M_PLUS
from capsnet.models import class_scores

# (output, labels (B,)) -> (B,) per-example loss, larger = further from the labels.
AttackLoss = Callable[[object, torch.Tensor], torch.Tensor]
DEFAULT_LOSS = "cw"
EVAL_BATCH = 250  # images per forward pass when only scores are needed


def attack_scores(output) -> torch.Tensor:
    """(B, J) float32 scores the attack losses read: capsule lengths or CNN logits."""
    return (output.scores if output.logits is None else output.logits).float()  # (B, J)


def margin_attack_loss(output, labels: torch.Tensor) -> torch.Tensor:
    """The paper's margin loss (Sabour et al. 2017, Eq. 4) per example (a CNN's lengths are
    its softmax probabilities). Flat once the true length passes m+ = 0.9 and every other
    falls below m- = 0.1: an attack on it stalls on every confidently classified image."""
    lengths = class_scores(output).float()  # (B, J)
    T = F.one_hot(labels, lengths.shape[-1]).to(lengths.dtype)  # (B, J)
    present = T * F.relu(M_PLUS - lengths).pow(2)
    absent = LAMBDA * (1 - T) * F.relu(lengths - M_MINUS).pow(2)
    return (present + absent).sum(dim=-1)  # (B,)


def cw_attack_loss(output, labels: torch.Tensor) -> torch.Tensor:
    """The C&W margin (Carlini & Wagner 2017): the best other class's score minus the true
    class's; never flat, the default."""
    scores = attack_scores(output)  # (B, J)
    own = scores.gather(1, labels.unsqueeze(1)).squeeze(1)  # (B,)
    others = scores.masked_fill(F.one_hot(labels, scores.shape[-1]).bool(), float("-inf"))
    return others.amax(dim=-1) - own  # (B,)


def ce_attack_loss(output, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the scores taken as logits (for capsules: the lengths)."""
    return F.cross_entropy(attack_scores(output), labels, reduction="none")  # (B,)


ATTACK_LOSSES: dict[str, AttackLoss] = {"cw": cw_attack_loss, "margin": margin_attack_loss,
                                        "ce": ce_attack_loss}


def attack_loss(name: str) -> AttackLoss:
    """The loss called ``name``; a ValueError naming the choices otherwise."""
    if name not in ATTACK_LOSSES:
        raise ValueError(f"unknown attack loss {name!r}; choose from {', '.join(ATTACK_LOSSES)}")
    return ATTACK_LOSSES[name]


def reconstruction_error(output, images: torch.Tensor) -> torch.Tensor:
    """(B,) sum of squared pixel errors between the winning capsule's reconstruction (the
    decoder fed the longest capsule) and ``images`` (B, C, H, W); DARCCC's distance."""
    if getattr(output, "reconstructions", None) is None:
        raise ValueError("the model has no reconstruction decoder; reconstruction scores and "
                         "the reconstructive attack need one")
    return (output.reconstructions.float() - images.float()).flatten(1).pow(2).sum(dim=-1)


def prepare_for_attack(model: nn.Module, full_routing_gradient: bool = True) -> nn.Module:
    """The same model in eval mode, float32 (no autocast), parameters frozen, and with
    gradients through every routing iteration (training detaches the earlier ones', which
    would hide part of the input gradient; ``full_routing_gradient`` False keeps that)."""
    model.eval()
    if hasattr(model, "compute_dtype"):
        model.compute_dtype = None
    model.requires_grad_(False)
    for module in model.modules():
        if hasattr(module, "full_graph"):
            module.full_graph = full_routing_gradient
    return model


@torch.no_grad()
def predict(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(N,) predicted classes of images x (N, C, H, W) in [0, 1]."""
    return torch.cat([class_scores(model(b)).argmax(-1) for b in x.split(EVAL_BATCH)])


@dataclasses.dataclass(frozen=True)
class Objective:
    """Called on adversarial images (B, C, H, W), returns the loss to maximise (B,) and
    whether each image fools ``model`` (B,) bool: classified other than ``labels``, or,
    targeted, as ``labels`` (the targets, whose loss it descends). ``surrogate`` (x ->
    output) gives the output the loss reads (the vote attack; default: the model's);
    ``reconstruction_weight`` > 0 subtracts that multiple of the reconstruction error (the
    reconstructive attack of Qin et al. 2020, against reconstruction-based detectors)."""

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
            loss = self.loss(output, self.labels)  # (B,)
            if self.targeted:
                loss = -loss
            if self.reconstruction_weight > 0:
                loss = loss - self.reconstruction_weight * reconstruction_error(output, x)
        predicted = class_scores(attacked).detach().argmax(-1)  # (B,)
        fooled = predicted == self.labels if self.targeted else predicted != self.labels
        return loss, fooled

    def restricted(self, idx: torch.Tensor) -> Objective:
        """The same objective for the examples ``idx`` (K,) of the batch."""
        return dataclasses.replace(self, labels=self.labels[idx])
