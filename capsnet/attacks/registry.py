"""Every attack by name and :func:`run_attack`, which builds its objective (white-box, vote
surrogate, reconstructive, targeted, from a transfer source) and runs it: once per loss of
the worst-case ensemble (each on the images the earlier losses left unfooled), and for the
reconstructive attacks once per weight of a grid, keeping per image the fooling image the
detector is least likely to flag."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from capsnet.attacks.capsule import RECONSTRUCTIVE_WEIGHTS, VoteSurrogate
from capsnet.attacks.methods import (
    CW_SEARCH_STEPS,
    CW_STEPS,
    SQUARE_QUERIES,
    apgd,
    cw_l2,
    pgd,
    square_linf,
    within_radius,
)
from capsnet.attacks.objectives import (
    DEFAULT_LOSS,
    WORST_LOSS,
    Objective,
    attack_loss,
    ensemble_losses,
    reconstruction_error,
)
from capsnet.models import class_scores


@dataclass(frozen=True)
class AttackSettings:
    """How hard every attack tries: gradient steps, restarts, the loss (``worst``: per
    image, the worst of the ensemble's), targeted or not, the seed (random starts, targets,
    Square's squares), Square's queries, C&W's steps and the reconstructive attacks' grid
    of weights (each image keeps its best)."""

    steps: int = 40
    restarts: int = 1
    loss: str = DEFAULT_LOSS
    targeted: bool = False
    seed: int = 0
    queries: int = SQUARE_QUERIES
    cw_steps: int = CW_STEPS
    cw_search_steps: int = CW_SEARCH_STEPS
    reconstruction_weights: tuple[float, ...] = RECONSTRUCTIVE_WEIGHTS
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
    # what the worst-case loss means for it: None = the ensemble; a loss = that one alone
    # (Square and C&W are defined on a margin)
    worst_loss: str | None = None


def _pgd(norm: str):
    def run(objective, x, eps, s, generator):
        return pgd(objective, x, eps, s.steps, norm, restarts=s.restarts, generator=generator)
    return run


def _fgsm(objective, x, eps, s, generator):
    return pgd(objective, x, eps, steps=1, step_size=eps, random_init=False)


def _apgd(objective, x, eps, s, generator):
    return apgd(objective, x, eps, s.steps, restarts=s.restarts, generator=generator)


def _bim(objective, x, eps, s, generator):
    return pgd(objective, x, eps, s.steps, step_size=eps / s.steps, random_init=False)


_pgd_linf = _pgd("linf")
ATTACKS: dict[str, AttackSpec] = {
    "fgsm": AttackSpec("linf", _fgsm, description="FGSM"),
    "bim": AttackSpec("linf", _bim, description="BIM (no random start)"),
    "pgd": AttackSpec("linf", _pgd_linf, description="PGD L-inf, random start"),
    "pgd-l2": AttackSpec("l2", _pgd("l2"), description="PGD L2, random start"),
    "apgd": AttackSpec("linf", _apgd, description="APGD L-inf (Croce & Hein 2020)"),
    "cw-l2": AttackSpec("l2", lambda o, x, eps, s, g: cw_l2(o, x, s.cw_steps,
                                                            s.cw_search_steps),
                        minimal_norm=True, worst_loss="cw",
                        description="C&W L2, minimal norm, counted within eps"),
    "square": AttackSpec("linf", lambda o, x, eps, s, g: square_linf(o, x, eps, s.queries, g),
                         worst_loss="logodds-cw", description="Square L-inf, gradient-free"),
    "vote": AttackSpec("linf", _pgd_linf, votes=True,
                       description="PGD L-inf on the squashed mean of the votes (a variant of "
                                   "Gu, Wu & Tresp 2021's vote attack)"),
    "reconstructive": AttackSpec("linf", _pgd_linf, reconstructive=True,
                                 description="PGD L-inf keeping the reconstruction error "
                                             "small, its weight the best per image of a grid "
                                             "(Qin et al. 2020)"),
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
    if settings.loss != WORST_LOSS:
        attack_loss(settings.loss)  # an unknown name fails before any work
    crafter = source if source is not None else model
    generator = torch.Generator(device=x.device).manual_seed(settings.seed)
    aims = labels
    if settings.targeted:
        num_classes = model.config.num_classes
        shift = torch.randint(1, num_classes, labels.shape, generator=generator,
                              device=labels.device)
        aims = (labels + shift) % num_classes  # (B,) never the true class
    surrogate = VoteSurrogate(crafter) if spec.votes else None
    loss = spec.worst_loss if settings.loss == WORST_LOSS and spec.worst_loss else settings.loss
    with torch.no_grad():  # a sample output, to drop the ensemble's duplicates (CNNs)
        losses = ensemble_losses(loss, (surrogate or crafter)(x), aims)

    def attack_with(weight: float) -> torch.Tensor:
        def objective(loss_name: str, idx: torch.Tensor) -> Objective:
            return Objective(crafter, aims[idx], attack_loss(loss_name), settings.targeted,
                             surrogate=surrogate, reconstruction_weight=weight)
        return worst_of(losses, objective, spec.run, x, eps, settings, generator)

    if spec.reconstructive:
        candidates = [attack_with(w) for w in sorted(settings.reconstruction_weights)]
        return least_detectable(crafter, x, aims, candidates, settings.targeted), aims
    if not spec.minimal_norm:
        return attack_with(0.0), aims
    cache = {} if minimal_norm_cache is None else minimal_norm_cache
    if name not in cache:
        cache[name] = attack_with(0.0)
    return within_radius(x, cache[name], eps), aims


def worst_of(losses: tuple[str, ...], objective: Callable[[str, torch.Tensor], Objective],
             run, x: torch.Tensor, eps: float, settings: AttackSettings,
             generator: torch.Generator) -> torch.Tensor:
    """The attack ``run`` once per loss in ``losses``, each on the images of x (B, C, H, W)
    no earlier loss fooled: per image, the first loss that fools it (AutoAttack's
    worst case over its attacks). ``objective(loss, idx)``: the objective of images idx."""
    adversarial = x.detach().float().clone()
    open_ = torch.ones(len(x), dtype=torch.bool, device=x.device)  # not fooled yet
    for loss_name in losses:
        idx = open_.nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        chosen = objective(loss_name, idx)
        adversarial[idx] = run(chosen, x[idx], eps, settings, generator)
        with torch.no_grad():
            _, fooled = chosen(adversarial[idx])
        open_[idx[fooled]] = False
    return adversarial


@torch.no_grad()
def least_detectable(model: nn.Module, x: torch.Tensor, aims: torch.Tensor,
                     candidates: list[torch.Tensor], targeted: bool) -> torch.Tensor:
    """Per image of x (B, C, H, W), among its ``candidates`` (each (B, C, H, W), ordered
    from the smallest reconstructive weight) that fool ``model``, the one with the smallest
    reconstruction error (the detectors' score); the first candidate where none fools."""
    chosen = candidates[0].clone()
    best_error = torch.full((len(x),), float("inf"), device=x.device)
    for candidate in candidates:
        output = model(candidate)
        predicted = class_scores(output).argmax(-1)  # (B,)
        fooled = predicted == aims if targeted else predicted != aims
        error = reconstruction_error(output, candidate)  # (B,)
        better = fooled & (error < best_error)
        chosen[better] = candidate[better]
        best_error = torch.where(better, error, best_error)
    return chosen
