"""What an attack maximises: per-example losses on a model's output, for every model alike.

The class scores are the capsule lengths (activations) of a capsule model and the logits of
a CNN. Three losses, each (B,) per example, larger = further from the true class
(untargeted) or closer to the target class (targeted):

- ``margin``: the paper's margin loss (Sabour et al. 2017, Eq. 4) on the lengths. It is
  flat, with zero gradient, once the true length passes m+ = 0.9 and every other falls
  below m- = 0.1, so an attack on it stalls on every confidently classified image.
- ``cw``: the C&W margin (Carlini & Wagner 2017): the best other class's score minus the
  true one's (targeted: the target's minus the best other's). Never flat; the default.
- ``ce``: cross-entropy of the scores taken as logits (for capsules: the lengths).

A CNN's "lengths" for ``margin`` are its softmax probabilities (:func:`capsnet.models.
class_scores`), so every loss applies to every model.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from capsnet.losses import LAMBDA, M_MINUS, M_PLUS
from capsnet.models import CapsuleOutput, MatrixCapsuleOutput, class_scores

# (output, labels (B,), targeted) -> (B,) per-example loss to maximise.
AttackLoss = Callable[[object, torch.Tensor, bool], torch.Tensor]
DEFAULT_LOSS = "cw"


def attack_scores(output) -> torch.Tensor:
    """(B, J) float32 scores the attack losses read: capsule lengths or CNN logits."""
    if isinstance(output, CapsuleOutput):
        return output.lengths.float()
    if isinstance(output, MatrixCapsuleOutput):
        return output.activations.float()
    return getattr(output, "logits", output).float()  # CNN, with or without a decoder


def margin_attack_loss(output, labels: torch.Tensor, targeted: bool) -> torch.Tensor:
    """The paper's margin loss per example on the class scores; targeted: its negative for
    the target class (descending it pulls the target up and the others down)."""
    lengths = class_scores(output).float()  # (B, J)
    T = F.one_hot(labels, lengths.shape[-1]).to(lengths.dtype)  # (B, J)
    present = T * F.relu(M_PLUS - lengths).pow(2)
    absent = LAMBDA * (1 - T) * F.relu(lengths - M_MINUS).pow(2)
    loss = (present + absent).sum(dim=-1)  # (B,)
    return -loss if targeted else loss


def best_other(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B,) the highest score among the classes other than ``labels``. scores: (B, J)."""
    others = scores.masked_fill(F.one_hot(labels, scores.shape[-1]).bool(), float("-inf"))
    return others.amax(dim=-1)


def cw_attack_loss(output, labels: torch.Tensor, targeted: bool) -> torch.Tensor:
    """best other score - true score (targeted: target score - best other score)."""
    scores = attack_scores(output)  # (B, J)
    own = scores.gather(1, labels.unsqueeze(1)).squeeze(1)  # (B,)
    gap = best_other(scores, labels) - own
    return -gap if targeted else gap


def ce_attack_loss(output, labels: torch.Tensor, targeted: bool) -> torch.Tensor:
    """Cross-entropy of the scores as logits; targeted: its negative for the target."""
    loss = F.cross_entropy(attack_scores(output), labels, reduction="none")  # (B,)
    return -loss if targeted else loss


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
