"""Gradient attacks in one projected-gradient loop: FGSM (Goodfellow et al. 2015), BIM
(Kurakin et al. 2017) and PGD (Madry et al. 2018) in the L-inf and L2 norms, with random
start and restarts.

Every attack here takes an :class:`~capsnet.attacks.threat.Objective`: a function of the
adversarial images (B, C, H, W) that returns the per-example loss to maximise (B,) and
whether each example already fools the attacked model (B,) bool. An example counts as
adversarial when any iterate fooled the model; it ends at the last iterate when that one
fools it (the most confident), else at the latest that did. Pixels stay in [0, 1].
"""
from __future__ import annotations

import torch

from capsnet.attacks.threat import Objective

NORMS = ("linf", "l2")
# PGD's step as a multiple of eps / steps (Madry et al. 2018 use 0.01 for eps 0.3 in
# 40 steps, i.e. 1.33; 2.5 as in the robustness library lets a restart cross the ball).
PGD_STEP_FACTOR = 2.5
TINY = 1e-12  # guards the division by a zero gradient or perturbation norm


def _norms(t: torch.Tensor) -> torch.Tensor:
    """(B,) L2 norms of (B, ...) -> shaped (B, 1, 1, 1) to broadcast over images."""
    return t.flatten(1).norm(dim=1).clamp_min(TINY).view(-1, *([1] * (t.dim() - 1)))


def project(delta: torch.Tensor, eps: float, norm: str) -> torch.Tensor:
    """``delta`` (B, C, H, W) moved to the nearest point of the eps-ball of ``norm``."""
    if norm == "linf":
        return delta.clamp(-eps, eps)
    return delta * (eps / _norms(delta)).clamp(max=1.0)


def ascent_step(grad: torch.Tensor, step_size: float, norm: str) -> torch.Tensor:
    """The steepest-ascent step of length ``step_size`` in ``norm``: sign(g) for L-inf,
    g / |g|_2 for L2."""
    if norm == "linf":
        return step_size * grad.sign()
    return step_size * grad / _norms(grad)


def random_start(x: torch.Tensor, eps: float, norm: str,
                 generator: torch.Generator | None) -> torch.Tensor:
    """A random perturbation inside the eps-ball: uniform per pixel (L-inf); a random
    direction at a uniform radius (L2)."""
    if norm == "linf":
        u = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return (2 * u - 1) * eps
    direction = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    radius = eps * torch.rand((len(x),), generator=generator, device=x.device, dtype=x.dtype)
    return direction / _norms(direction) * radius.view(-1, *([1] * (x.dim() - 1)))


def input_gradient(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """d(sum of loss)/dx, zero where no path leads from x to the loss (a model that
    detaches its input masks its gradient; the sanity checks then report it)."""
    if not loss.requires_grad:
        return torch.zeros_like(x)
    grad, = torch.autograd.grad(loss.sum(), x, allow_unused=True)
    return torch.zeros_like(x) if grad is None else grad


def _one_run(objective: Objective, x: torch.Tensor, eps: float, norm: str, steps: int,
             step_size: float, start: bool,
             generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One projected-gradient run from x (B, C, H, W): (adversarial images, fooled (B,)).
    Each image ends at the last iterate, or, where that one does not fool the model, at the
    latest iterate that did (the last is the most confident: the loss keeps rising)."""
    delta = random_start(x, eps, norm, generator) if start else torch.zeros_like(x)
    delta = (x + delta).clamp(0, 1) - x
    latest_fooling = x + delta
    fooled = torch.zeros(len(x), dtype=torch.bool, device=x.device)
    for _ in range(steps):
        x_adv = (x + delta).requires_grad_(True)
        loss, success = objective(x_adv)
        grad = input_gradient(loss, x_adv)
        latest_fooling = torch.where(success.view(-1, 1, 1, 1), x_adv.detach(), latest_fooling)
        fooled |= success
        delta = project(delta + ascent_step(grad, step_size, norm), eps, norm)
        delta = (x + delta).clamp(0, 1) - x
    with torch.no_grad():
        _, success = objective(x + delta)
    keep_last = success | ~fooled
    best = torch.where(keep_last.view(-1, 1, 1, 1), x + delta, latest_fooling)
    return best, fooled | success


def pgd(objective: Objective, x: torch.Tensor, eps: float, steps: int = 40,
        norm: str = "linf", step_size: float | None = None, random_init: bool = True,
        restarts: int = 1, generator: torch.Generator | None = None) -> torch.Tensor:
    """Projected gradient ascent in the ``norm`` eps-ball around x (B, C, H, W) in [0, 1].
    ``step_size`` defaults to PGD_STEP_FACTOR * eps / steps. Each restart (a fresh random
    start) attacks only the examples no earlier run fooled. Returns (B, C, H, W)."""
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; choose from {', '.join(NORMS)}")
    if steps < 1 or restarts < 1:
        raise ValueError(f"steps ({steps}) and restarts ({restarts}) must be at least 1")
    step_size = PGD_STEP_FACTOR * eps / steps if step_size is None else step_size
    x = x.detach().float()
    adversarial = x.clone()
    open_ = torch.ones(len(x), dtype=torch.bool, device=x.device)  # not fooled yet
    for _ in range(restarts):
        idx = open_.nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        best, fooled = _one_run(objective.restricted(idx), x[idx], eps, norm, steps, step_size,
                                random_init, generator)
        adversarial[idx] = best
        open_[idx[fooled]] = False
    return adversarial


def fgsm(objective: Objective, x: torch.Tensor, eps: float) -> torch.Tensor:
    """One signed-gradient step of size eps (L-inf), no random start."""
    return pgd(objective, x, eps, steps=1, norm="linf", step_size=eps, random_init=False)


def bim(objective: Objective, x: torch.Tensor, eps: float, steps: int = 10) -> torch.Tensor:
    """FGSM iterated with step eps / steps, clipped to the L-inf ball, no random start."""
    return pgd(objective, x, eps, steps=steps, norm="linf", step_size=eps / steps,
               random_init=False)
