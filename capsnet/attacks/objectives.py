"""What an attack maximises, for every model alike: losses on the class scores (capsule
lengths or activations, CNN logits) or on their log-odds log(L / (1 - L)) (for a CNN: its
logits), each (B,), larger = further from the labels; the per-image worst of several
losses (WORST_LOSS, the default, as AutoAttack's ensemble); and the :class:`Objective` an
attack climbs, which also judges its success.

Why the log-odds: the squash is flat near a confident capsule's length (dL/d|s| ~ 0.04 at
L = 0.93), so a loss on the lengths mostly lifts the runner-up; log(L / (1 - L)) undoes
that flattening, as a CNN's logits undo its softmax's."""
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
WORST_LOSS = "worst"  # per image, the first of ENSEMBLE_LOSSES that fools it
DEFAULT_LOSS = WORST_LOSS
LOG_ODDS_EPS = 1e-6  # scores clamped to [eps, 1 - eps] before log(L / (1 - L))
DLR_EPS = 1e-12  # AutoAttack's guard of the DLR denominator
EVAL_BATCH = 250  # images per forward pass when only scores are needed


def attack_scores(output) -> torch.Tensor:
    """(B, J) float32 scores the attack losses read: capsule lengths or CNN logits."""
    return (output.scores if output.logits is None else output.logits).float()  # (B, J)


def log_odds_scores(output) -> torch.Tensor:
    """(B, J) float32 log-odds log(L / (1 - L)) of capsule scores L; a CNN's logits as
    they are (its scores are already on that scale)."""
    if output.logits is not None:
        return output.logits.float()
    return torch.logit(class_scores(output).float(), eps=LOG_ODDS_EPS)


def _true_and_best_other(scores: torch.Tensor,
                         labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) the true class's score and (B,) the best other class's, of scores (B, J)."""
    own = scores.gather(1, labels.unsqueeze(1)).squeeze(1)  # (B,)
    others = scores.masked_fill(F.one_hot(labels, scores.shape[-1]).bool(), float("-inf"))
    return own, others.amax(dim=-1)


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
    own, other = _true_and_best_other(attack_scores(output), labels)  # (B,), (B,)
    return other - own


def ce_attack_loss(output, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the scores taken as logits (for capsules: the lengths)."""
    return F.cross_entropy(attack_scores(output), labels, reduction="none")  # (B,)


def log_odds_cw_attack_loss(output, labels: torch.Tensor) -> torch.Tensor:
    """The C&W margin on the log-odds: best other minus true (a CNN: ``cw`` itself)."""
    own, other = _true_and_best_other(log_odds_scores(output), labels)  # (B,), (B,)
    return other - own


def log_odds_ce_attack_loss(output, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the log-odds taken as logits (a CNN: ``ce`` itself)."""
    return F.cross_entropy(log_odds_scores(output), labels, reduction="none")  # (B,)


def dlr_attack_loss(output, labels: torch.Tensor) -> torch.Tensor:
    """The difference of logits ratio of Croce & Hein (2020) on the log-odds:
    (best other - true) / (z_pi1 - z_pi3), the scores sorted z_pi1 >= z_pi2 >= ...;
    invariant to shifting and scaling the scores, AutoAttack's second loss."""
    z = log_odds_scores(output)  # (B, J)
    own, other = _true_and_best_other(z, labels)  # (B,), (B,)
    top = z.sort(dim=-1, descending=True).values  # (B, J)
    return (other - own) / (top[:, 0] - top[:, 2] + DLR_EPS)


ATTACK_LOSSES: dict[str, AttackLoss] = {"cw": cw_attack_loss, "margin": margin_attack_loss,
                                        "ce": ce_attack_loss,
                                        "logodds-ce": log_odds_ce_attack_loss,
                                        "logodds-cw": log_odds_cw_attack_loss,
                                        "dlr": dlr_attack_loss}
# The worst-case loss's members, in the order they run (each on the images the earlier
# left unfooled): the strongest single loss on the shipped CapsNet first.
ENSEMBLE_LOSSES = ("logodds-ce", "logodds-cw", "dlr", "ce", "cw")
LOSS_CHOICES = (WORST_LOSS, *ATTACK_LOSSES)


def attack_loss(name: str) -> AttackLoss:
    """The loss called ``name``; a ValueError naming the choices otherwise (the worst-case
    loss is no single function: :func:`ensemble_losses` gives its members)."""
    if name not in ATTACK_LOSSES:
        raise ValueError(f"unknown attack loss {name!r}; choose from "
                         f"{', '.join(LOSS_CHOICES)}")
    return ATTACK_LOSSES[name]


def ensemble_losses(name: str, output, labels: torch.Tensor) -> tuple[str, ...]:
    """The losses the loss ``name`` runs: itself, or for the worst case the members of
    ENSEMBLE_LOSSES that differ on ``output`` (a sample of the model's, with ``labels``):
    on a CNN the log-odds losses equal ce and cw and are run once."""
    if name != WORST_LOSS:
        attack_loss(name)
        return (name,)
    kept, values = [], []
    for member in ENSEMBLE_LOSSES:
        value = ATTACK_LOSSES[member](output, labels)
        if not any(torch.allclose(value, v) for v in values):
            kept.append(member)
            values.append(value)
    return tuple(kept)


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
