"""The attack algorithms, each on an :class:`~capsnet.attacks.objectives.Objective`, pixels
kept in [0, 1]: FGSM (Goodfellow et al. 2015), BIM (Kurakin et al. 2017) and PGD (Madry et
al. 2018) in one projected-gradient loop, L-inf and L2; Carlini & Wagner's L2 attack (2017),
minimal norm; and the gradient-free Square attack (Andriushchenko et al. 2020), L-inf, the
check against gradient masking (it must not beat PGD).
"""
from __future__ import annotations

import math

import torch

from capsnet.attacks.objectives import Objective

NORMS = ("linf", "l2")
# PGD's step as a multiple of eps / steps (Madry et al. 2018 use 0.01 for eps 0.3 in
# 40 steps, i.e. 1.33; 2.5 as in the robustness library lets a restart cross the ball).
PGD_STEP_FACTOR = 2.5
TINY = 1e-12  # guards the division by a zero gradient or perturbation norm
CW_STEPS = 100  # Adam steps per value of c
CW_SEARCH_STEPS = 6  # binary-search rounds over c
CW_INITIAL_C = 10.0  # class scores (lengths) live in [0, 1]: c must outweigh |delta|^2 ~ 1-10
CW_LR = 0.1  # Adam step per pixel (pixel space, [0, 1])
CW_GROWTH = 10.0  # c grows tenfold while no upper bound is known
SQUARE_QUERIES = 1000
P_INIT = 0.05  # the paper's initial fraction of pixels changed per query (MNIST: 0.3 for 10k)
# The square's area halves at these fractions of a 10,000-query budget (the paper's schedule).
P_HALVINGS = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)
REFERENCE_QUERIES = 10_000


def _norms(t: torch.Tensor) -> torch.Tensor:
    """The L2 norm of each of t (B, C, H, W), shaped (B, 1, 1, 1) to broadcast."""
    return t.flatten(1).norm(dim=1).clamp_min(TINY).view(-1, 1, 1, 1)


def project(delta: torch.Tensor, eps: float, norm: str) -> torch.Tensor:
    """``delta`` (B, C, H, W) moved to the nearest point of the eps-ball of ``norm``."""
    if norm == "linf":
        return delta.clamp(-eps, eps)
    return delta * (eps / _norms(delta)).clamp(max=1.0)


def random_start(x: torch.Tensor, eps: float, norm: str,
                 generator: torch.Generator | None) -> torch.Tensor:
    """A random perturbation inside the eps-ball: uniform per pixel (L-inf); a random
    direction at a uniform radius (L2)."""
    if norm == "linf":
        u = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype)
        return (2 * u - 1) * eps
    direction = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
    radius = eps * torch.rand((len(x),), generator=generator, device=x.device, dtype=x.dtype)
    return direction / _norms(direction) * radius.view(-1, 1, 1, 1)


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
        # zero where no path leads from x to the loss (a model that detaches its input
        # masks its gradient; the sanity checks then report it)
        grad = torch.zeros_like(x_adv)
        if loss.requires_grad:
            grad, = torch.autograd.grad(loss.sum(), x_adv, materialize_grads=True)
        latest_fooling = torch.where(success.view(-1, 1, 1, 1), x_adv.detach(), latest_fooling)
        fooled |= success
        # steepest ascent: sign(g) for L-inf, g / |g|_2 for L2
        step = step_size * grad.sign() if norm == "linf" else step_size * grad / _norms(grad)
        delta = project(delta + step, eps, norm)
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
    start) attacks only the examples no earlier run fooled. FGSM is one step of size eps
    and BIM steps of eps / steps, both without random start. Returns (B, C, H, W)."""
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


def cw_l2(objective: Objective, x: torch.Tensor, steps: int = CW_STEPS,
          search_steps: int = CW_SEARCH_STEPS) -> torch.Tensor:
    """For each of x (B, C, H, W) the smallest L2 perturbation found that fools the model:
    Adam on |delta|^2 + c * max(-loss, 0), with a per-example binary search over c. The
    perturbation is optimised in pixel space and projected onto the box [0, 1] after each
    step (Carlini & Wagner's tanh change of variables freezes saturated pixels, most of an
    MNIST image: at 0 or 1 a pixel's gradient in tanh space vanishes). An image never
    fooled is returned unchanged (callers judge success again)."""
    x = x.detach().float()
    B = len(x)
    c = torch.full((B,), CW_INITIAL_C, device=x.device)
    lower = torch.zeros(B, device=x.device)
    upper = torch.full((B,), float("inf"), device=x.device)
    best_dist = torch.full((B,), float("inf"), device=x.device)
    best = x.clone()
    for _ in range(search_steps):
        delta = torch.zeros_like(x, requires_grad=True)  # (B, C, H, W)
        optimiser = torch.optim.Adam([delta], lr=CW_LR)
        found = torch.zeros(B, dtype=torch.bool, device=x.device)
        for _ in range(steps):
            x_adv = x + delta
            loss, fooled = objective(x_adv)  # (B,), (B,)
            dist = delta.flatten(1).pow(2).sum(dim=1)  # (B,)
            better = fooled & (dist.detach() < best_dist)
            best_dist = torch.where(better, dist.detach(), best_dist)
            best = torch.where(better.view(-1, 1, 1, 1), x_adv.detach(), best)
            found |= fooled
            total = dist + c * (-loss).clamp(min=0.0)
            optimiser.zero_grad()
            total.sum().backward()
            optimiser.step()
            with torch.no_grad():
                delta.copy_((x + delta).clamp(0, 1) - x)
        upper = torch.where(found, torch.minimum(upper, c), upper)
        lower = torch.where(found, lower, torch.maximum(lower, c))
        c = torch.where(upper.isinf(), c * CW_GROWTH, (lower + upper) / 2)
    return best


def within_radius(x: torch.Tensor, x_adv: torch.Tensor, eps: float) -> torch.Tensor:
    """``x_adv`` where its L2 distance to x is at most eps, else x (both (B, C, H, W)):
    a minimal-norm attack's images, counted at radius eps."""
    inside = (x_adv - x).flatten(1).norm(dim=1) <= eps  # (B,)
    return torch.where(inside.view(-1, 1, 1, 1), x_adv, x)


def _corner_signs(shape: tuple[int, ...], generator, device) -> torch.Tensor:
    return 2 * torch.randint(0, 2, shape, generator=generator, device=device).float() - 1


@torch.no_grad()
def square_linf(objective: Objective, x: torch.Tensor, eps: float,
                queries: int = SQUARE_QUERIES,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Square: per query, one random square of the perturbation is set to a random corner
    of the eps-ball (L-inf) and kept when the loss rises. Returns (B, C, H, W) found with
    ``queries`` forward passes at most per image; fooled examples stop being queried."""
    x = x.detach().float()
    B, C, H, W = x.shape
    # initialisation: vertical stripes of +-eps (the paper's)
    x_best = (x + eps * _corner_signs((B, C, 1, W), generator, x.device)).clamp(0, 1)
    loss_best, fooled = objective(x_best)
    for query in range(queries):
        idx = (~fooled).nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        at = query * REFERENCE_QUERIES / queries  # the paper's schedule, rescaled to the budget
        fraction = P_INIT / 2 ** sum(at > h for h in P_HALVINGS)
        side = max(1, min(H, round(math.sqrt(fraction * H * W))))
        top = int(torch.randint(0, H - side + 1, (1,), generator=generator, device=x.device))
        left = int(torch.randint(0, W - side + 1, (1,), generator=generator, device=x.device))
        x_sub, best_sub = x[idx], x_best[idx]
        delta = best_sub - x_sub  # (K, C, H, W)
        delta[:, :, top:top + side, left:left + side] = \
            eps * _corner_signs((len(idx), C, 1, 1), generator, x.device)
        candidate = (x_sub + delta).clamp(0, 1)
        loss, now_fooled = objective.restricted(idx)(candidate)
        better = loss > loss_best[idx]
        x_best[idx[better]] = candidate[better]
        loss_best[idx[better]] = loss[better]
        fooled[idx[better]] = now_fooled[better]
    return x_best
