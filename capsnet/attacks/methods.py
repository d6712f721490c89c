"""The attack algorithms, each on an :class:`~capsnet.attacks.objectives.Objective`, pixels
kept in [0, 1]: FGSM (Goodfellow et al. 2015), BIM (Kurakin et al. 2017) and PGD (Madry et
al. 2018) in one projected-gradient loop, L-inf and L2; APGD (Croce & Hein 2020), PGD with
momentum and a step size halved where progress stalls; Carlini & Wagner's L2 attack (2017),
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
SQUARE_QUERIES = 10_000  # the paper's budget
P_INIT = 0.8  # the initial fraction of pixels a square covers: the paper's for MNIST, L-inf
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
    return _with_restarts(lambda o, xs: _one_run(o, xs, eps, norm, steps, step_size,
                                                 random_init, generator),
                          objective, x, restarts)


def _with_restarts(one_run, objective: Objective, x: torch.Tensor,
                   restarts: int) -> torch.Tensor:
    """``restarts`` runs of ``one_run(objective, images) -> (adversarial, fooled)``, each
    on the images of x (B, C, H, W) no earlier run fooled."""
    x = x.detach().float()
    adversarial = x.clone()
    open_ = torch.ones(len(x), dtype=torch.bool, device=x.device)  # not fooled yet
    for _ in range(restarts):
        idx = open_.nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        best, fooled = one_run(objective.restricted(idx), x[idx])
        adversarial[idx] = best
        open_[idx[fooled]] = False
    return adversarial


# APGD's constants (Croce & Hein 2020, section 3 and their code): momentum, the share of
# rising steps below which the step halves, the first checkpoint and the shortest and
# shrinking gaps between checkpoints, as fractions of the steps; the first step, x eps.
APGD_MOMENTUM = 0.75
APGD_RHO = 0.75
APGD_FIRST_CHECK = 0.22
APGD_MIN_GAP = 0.06
APGD_GAP_SHRINK = 0.03
APGD_INITIAL_STEP = 2.0


def _ascent_step(delta_grad: torch.Tensor, step: torch.Tensor, norm: str) -> torch.Tensor:
    """Per-image steps (B,) of steepest ascent along grad (B, C, H, W) in ``norm``."""
    direction = delta_grad.sign() if norm == "linf" else delta_grad / _norms(delta_grad)
    return step.view(-1, 1, 1, 1) * direction


def _apgd_run(objective: Objective, x: torch.Tensor, eps: float, norm: str, steps: int,
              generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One APGD run from a random start around x (B, C, H, W): (adversarial images,
    fooled (B,)). Each image ends at an iterate that fooled the model if any did, else at
    its highest-loss iterate."""
    B = len(x)

    def clip(candidate: torch.Tensor) -> torch.Tensor:
        return x + ((x + project(candidate - x, eps, norm)).clamp(0, 1) - x)

    def evaluate(x_adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x_adv = x_adv.detach().requires_grad_(True)
        loss, success = objective(x_adv)  # (B,), (B,)
        grad = torch.zeros_like(x_adv)
        if loss.requires_grad:
            grad, = torch.autograd.grad(loss.sum(), x_adv, materialize_grads=True)
        return loss.detach(), success, grad

    x_adv = clip(x + random_start(x, eps, norm, generator))
    loss, fooled, grad = evaluate(x_adv)
    fooling = x_adv.clone()  # the latest iterate that fooled each image
    best, best_loss, best_grad = x_adv.clone(), loss.clone(), grad.clone()
    step = torch.full((B,), APGD_INITIAL_STEP * eps, device=x.device)
    previous = x_adv.clone()
    gap = max(math.ceil(APGD_FIRST_CHECK * steps), 1)
    min_gap, shrink = max(math.ceil(APGD_MIN_GAP * steps), 1), max(math.ceil(
        APGD_GAP_SHRINK * steps), 1)
    since_check, rises = 0, torch.zeros(B, device=x.device)
    best_at_check = best_loss.clone()
    halved_at_check = torch.zeros(B, dtype=torch.bool, device=x.device)
    for i in range(steps):
        momentum = APGD_MOMENTUM if i > 0 else 1.0
        z = clip(x_adv + _ascent_step(grad, step, norm))
        candidate = clip(x_adv + momentum * (z - x_adv) + (1 - momentum) * (x_adv - previous))
        previous, x_adv = x_adv, candidate
        new_loss, success, grad = evaluate(x_adv)
        fooling = torch.where(success.view(-1, 1, 1, 1), x_adv, fooling)
        fooled |= success
        rises += (new_loss > loss).float()
        loss = new_loss
        better = loss > best_loss
        best = torch.where(better.view(-1, 1, 1, 1), x_adv, best)
        best_grad = torch.where(better.view(-1, 1, 1, 1), grad, best_grad)
        best_loss = torch.where(better, loss, best_loss)
        since_check += 1
        if since_check == gap:  # a checkpoint: halve the step where progress stalled
            stalled = rises <= APGD_RHO * gap
            no_gain = ~halved_at_check & (best_at_check >= best_loss)
            halve = stalled | no_gain
            step = torch.where(halve, step / 2, step)
            x_adv = torch.where(halve.view(-1, 1, 1, 1), best, x_adv)
            grad = torch.where(halve.view(-1, 1, 1, 1), best_grad, grad)
            halved_at_check, best_at_check = halve, best_loss.clone()
            since_check, rises = 0, torch.zeros_like(rises)
            gap = max(gap - shrink, min_gap)
    return torch.where(fooled.view(-1, 1, 1, 1), fooling, best), fooled


def apgd(objective: Objective, x: torch.Tensor, eps: float, steps: int = 100,
         norm: str = "linf", restarts: int = 1,
         generator: torch.Generator | None = None) -> torch.Tensor:
    """Auto-PGD (Croce & Hein 2020) in the ``norm`` eps-ball around x (B, C, H, W) in
    [0, 1]: momentum 0.75 and a per-image step, 2 eps at first, halved at checkpoints
    where the loss rose in at most 75% of the steps since the last one or its best value
    did not improve (the run then resumes from its best point). No step size to tune:
    AutoAttack's parameter-free PGD. Restarts as :func:`pgd`'s."""
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; choose from {', '.join(NORMS)}")
    if steps < 1 or restarts < 1:
        raise ValueError(f"steps ({steps}) and restarts ({restarts}) must be at least 1")
    return _with_restarts(lambda o, xs: _apgd_run(o, xs, eps, norm, steps, generator),
                          objective, x, restarts)


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
    """Square: per query, one random square of each image's perturbation (its place drawn
    per image) is set to a random corner of the eps-ball (L-inf), a sign per channel, and
    kept when the loss rises; the square covers P_INIT of the pixels at first and halves
    on the paper's schedule. Returns (B, C, H, W) found with ``queries`` forward passes at
    most per image; fooled examples stop being queried."""
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
        K = len(idx)
        top = torch.randint(0, H - side + 1, (K, 1, 1, 1), generator=generator, device=x.device)
        left = torch.randint(0, W - side + 1, (K, 1, 1, 1), generator=generator,
                             device=x.device)
        rows = torch.arange(H, device=x.device).view(1, 1, H, 1)
        cols = torch.arange(W, device=x.device).view(1, 1, 1, W)
        inside = ((rows >= top) & (rows < top + side)
                  & (cols >= left) & (cols < left + side))  # (K, 1, H, W)
        x_sub, best_sub = x[idx], x_best[idx]
        corner = eps * _corner_signs((K, C, 1, 1), generator, x.device)  # (K, C, 1, 1)
        delta = torch.where(inside, corner, best_sub - x_sub)  # (K, C, H, W)
        candidate = (x_sub + delta).clamp(0, 1)
        loss, now_fooled = objective.restricted(idx)(candidate)
        better = loss > loss_best[idx]
        x_best[idx[better]] = candidate[better]
        loss_best[idx[better]] = loss[better]
        fooled[idx[better]] = now_fooled[better]
    return x_best
