"""Adversarial training's batches: each training batch replaced by adversarial images of the
model being trained, by fast adversarial training (FGSM from a random start, Wong, Rice &
Kolter 2020) or by PGD (Madry et al. 2018).

The attack runs on the training model as it is, in its training mode (as both papers do:
dropout and the routing's training graph included), its parameters untouched: only the
input gradient is taken, so no parameter gradient accumulates. It maximises the cross
entropy of the log-odds (``logodds-ce``: for a CNN the cross entropy of its logits, its
own training loss; for capsules the loss that attacks them best, the margin loss being
flat on confident outputs)."""
from __future__ import annotations

import torch
from torch import nn

from capsnet.attacks.methods import project, random_start
from capsnet.attacks.objectives import attack_loss

ADVERSARIAL_KINDS = ("fgsm-rs", "pgd")
TRAINING_LOSS = "logodds-ce"
FGSM_RS_STEP = 1.25  # FGSM-RS's step, x eps (Wong et al. 2020)
PGD_STEP_FACTOR = 2.5  # PGD's default step, x eps / steps (as capsnet.attacks.methods)


def check_adversarial(kind: str, eps: float | None, steps: int) -> None:
    """A one-line ValueError for an adversarial training that cannot run."""
    if kind not in ADVERSARIAL_KINDS:
        raise ValueError(f"unknown adversarial training {kind!r}; choose from "
                         f"{', '.join(ADVERSARIAL_KINDS)}")
    if eps is None or eps <= 0 or steps < 1:
        raise ValueError(f"adversarial training needs a positive eps (given: {eps}; e.g. 0.3 "
                         f"on MNIST, 0.1 on Fashion-MNIST) and at least 1 step (given: {steps})")


def adversarial_batch(model: nn.Module, x: torch.Tensor, y: torch.Tensor, kind: str,
                      eps: float, steps: int = 10, step_size: float | None = None,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """Adversarial versions (B, C, H, W) in [0, 1] of the training images x (B, C, H, W),
    labels y (B,), in the L-inf eps-ball: ``fgsm-rs``, one step of 1.25 eps from a uniform
    random start; ``pgd``, ``steps`` steps of ``step_size`` (default 2.5 eps / steps) from
    a random start. Detached: the caller trains on them as on clean images."""
    check_adversarial(kind, eps, steps)
    if kind == "fgsm-rs":
        steps, step_size = 1, FGSM_RS_STEP * eps
    elif step_size is None:
        step_size = PGD_STEP_FACTOR * eps / steps
    loss_fn = attack_loss(TRAINING_LOSS)
    x = x.detach()
    delta = (x + random_start(x, eps, "linf", generator)).clamp(0, 1) - x
    for _ in range(steps):
        x_adv = (x + delta).requires_grad_(True)
        loss = loss_fn(model(x_adv), y).sum()
        grad, = torch.autograd.grad(loss, x_adv)
        delta = project(delta + step_size * grad.sign(), eps, "linf")
        delta = (x + delta).clamp(0, 1) - x
    return (x + delta).detach()
