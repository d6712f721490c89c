"""Every attack by name and :func:`run_attack`, which builds its objective (white-box, vote
surrogate, reconstructive, targeted, from a transfer source) and runs it."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from capsnet.attacks.capsule import RECONSTRUCTIVE_WEIGHT, VoteSurrogate
from capsnet.attacks.methods import (
    CW_SEARCH_STEPS,
    CW_STEPS,
    SQUARE_QUERIES,
    cw_l2,
    pgd,
    square_linf,
    within_radius,
)
from capsnet.attacks.objectives import DEFAULT_LOSS, Objective, attack_loss


@dataclass(frozen=True)
class AttackSettings:
    """How hard every attack tries: gradient steps, restarts, the loss, targeted or not,
    the seed (random starts, targets, Square's squares), Square's queries and C&W's steps."""

    steps: int = 40
    restarts: int = 1
    loss: str = DEFAULT_LOSS
    targeted: bool = False
    seed: int = 0
    queries: int = SQUARE_QUERIES
    cw_steps: int = CW_STEPS
    cw_search_steps: int = CW_SEARCH_STEPS
    reconstruction_weight: float = RECONSTRUCTIVE_WEIGHT
    routing_gradient: str = "full"  # how the model was prepared (prepare_for_attack), recorded


DEFAULT_SETTINGS = AttackSettings()


@dataclass(frozen=True)
class AttackSpec:
    """An attack: its norm, the function (objective, x, eps, settings, generator) -> images
    that runs it, and whether it reads the vote surrogate or the reconstruction error."""

    norm: str
    run: Callable[[Objective, torch.Tensor, float, AttackSettings, torch.Generator],
                  torch.Tensor]
    votes: bool = False
    reconstructive: bool = False
    minimal_norm: bool = False  # run once, ignoring eps; images farther than eps count clean
    description: str = ""


def _pgd(norm: str):
    def run(objective, x, eps, s, generator):
        return pgd(objective, x, eps, s.steps, norm, restarts=s.restarts, generator=generator)
    return run


def _fgsm(objective, x, eps, s, generator):
    return pgd(objective, x, eps, steps=1, step_size=eps, random_init=False)


def _bim(objective, x, eps, s, generator):
    return pgd(objective, x, eps, s.steps, step_size=eps / s.steps, random_init=False)


_pgd_linf = _pgd("linf")
ATTACKS: dict[str, AttackSpec] = {
    "fgsm": AttackSpec("linf", _fgsm, description="FGSM"),
    "bim": AttackSpec("linf", _bim, description="BIM (no random start)"),
    "pgd": AttackSpec("linf", _pgd_linf, description="PGD L-inf, random start"),
    "pgd-l2": AttackSpec("l2", _pgd("l2"), description="PGD L2, random start"),
    "cw-l2": AttackSpec("l2", lambda o, x, eps, s, g: cw_l2(o, x, s.cw_steps,
                                                            s.cw_search_steps),
                        minimal_norm=True, description="C&W L2, minimal norm, counted within eps"),
    "square": AttackSpec("linf", lambda o, x, eps, s, g: square_linf(o, x, eps, s.queries, g),
                         description="Square L-inf, gradient-free"),
    "vote": AttackSpec("linf", _pgd_linf, votes=True,
                       description="PGD L-inf on the mean of the votes (Gu et al. 2021)"),
    "reconstructive": AttackSpec("linf", _pgd_linf, reconstructive=True,
                                 description="PGD L-inf keeping the reconstruction error "
                                             "small (Qin et al. 2020)"),
    "vote-detect": AttackSpec("linf", _pgd_linf, votes=True, reconstructive=True,
                              description="detection-aware vote attack"),
}


def attack_spec(name: str) -> AttackSpec:
    """The attack called ``name``; a ValueError naming the choices otherwise."""
    if name not in ATTACKS:
        raise ValueError(f"unknown attack {name!r}; choose from {', '.join(ATTACKS)}")
    return ATTACKS[name]


def run_attack(name: str, model: nn.Module, x: torch.Tensor, labels: torch.Tensor, eps: float,
               settings: AttackSettings = DEFAULT_SETTINGS, source: nn.Module | None = None,
               minimal_norm_cache: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attack ``model`` (or craft on ``source``, a transfer attack) on images x (B, C, H, W)
    with true labels (B,). Returns (adversarial images, the labels aimed at: the true ones,
    or seeded random other classes for a targeted attack). A minimal-norm attack runs once
    per ``minimal_norm_cache`` (a dict the caller keeps per model, images and settings) and
    is cut to radius eps."""
    spec = attack_spec(name)
    loss = attack_loss(settings.loss)
    crafter = source if source is not None else model
    generator = torch.Generator(device=x.device).manual_seed(settings.seed)
    aims = labels
    if settings.targeted:
        num_classes = model.config.num_classes
        shift = torch.randint(1, num_classes, labels.shape, generator=generator,
                              device=labels.device)
        aims = (labels + shift) % num_classes  # (B,) never the true class
    objective = Objective(crafter, aims, loss, settings.targeted,
                          surrogate=VoteSurrogate(crafter) if spec.votes else None,
                          reconstruction_weight=(settings.reconstruction_weight
                                                 if spec.reconstructive else 0.0))
    if not spec.minimal_norm:
        return spec.run(objective, x, eps, settings, generator), aims
    cache = {} if minimal_norm_cache is None else minimal_norm_cache
    if name not in cache:
        cache[name] = spec.run(objective, x, eps, settings, generator)
    return within_radius(x, cache[name], eps), aims
