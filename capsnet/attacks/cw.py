"""Carlini & Wagner's L2 attack (2017), minimal norm: for each image the smallest L2
perturbation found that fools the model, by Adam in tanh space on
|delta|^2 + c * max(-loss, -kappa), with a per-example binary search over c.

The loss is the :class:`~capsnet.attacks.threat.Objective`'s (by default the C&W margin of
the class scores: best other minus true, > 0 once fooled). Robust accuracy at radius eps
counts an image as broken when its minimal perturbation is at most eps
(:func:`within_radius`)."""
from __future__ import annotations

import torch

from capsnet.attacks.threat import Objective

CW_STEPS = 100  # Adam steps per value of c
CW_SEARCH_STEPS = 6  # binary-search rounds over c
CW_INITIAL_C = 10.0  # class scores (lengths) live in [0, 1]: c must outweigh |delta|^2 ~ 1-10
CW_LR = 0.05
CW_GROWTH = 10.0  # c grows tenfold while no upper bound is known
TANH_LIMIT = 1 - 1e-6  # keeps atanh finite at pixels 0 and 1


def cw_l2(objective: Objective, x: torch.Tensor, steps: int = CW_STEPS,
          search_steps: int = CW_SEARCH_STEPS, initial_c: float = CW_INITIAL_C,
          lr: float = CW_LR, kappa: float = 0.0) -> torch.Tensor:
    """The smallest-L2 adversarial image found for each of x (B, C, H, W) in [0, 1]; an
    image never fooled is returned unchanged (its perturbation norm 0 but not fooled:
    callers judge success again). Returns (B, C, H, W)."""
    x = x.detach().float()
    B = len(x)
    w0 = torch.atanh((2 * x - 1) * TANH_LIMIT)  # (B, C, H, W)
    c = torch.full((B,), initial_c, device=x.device)
    lower = torch.zeros(B, device=x.device)
    upper = torch.full((B,), float("inf"), device=x.device)
    best_dist = torch.full((B,), float("inf"), device=x.device)
    best = x.clone()
    for _ in range(search_steps):
        w = w0.clone().requires_grad_(True)
        optimiser = torch.optim.Adam([w], lr=lr)
        found = torch.zeros(B, dtype=torch.bool, device=x.device)
        for _ in range(steps):
            x_adv = (torch.tanh(w) + 1) / 2
            loss, fooled = objective(x_adv)  # (B,), (B,)
            dist = (x_adv - x).flatten(1).pow(2).sum(dim=1)  # (B,)
            better = fooled & (dist.detach() < best_dist)
            best_dist = torch.where(better, dist.detach(), best_dist)
            best = torch.where(better.view(-1, 1, 1, 1), x_adv.detach(), best)
            found |= fooled
            total = dist + c * (-loss).clamp(min=-kappa)
            optimiser.zero_grad()
            total.sum().backward()
            optimiser.step()
        upper = torch.where(found, torch.minimum(upper, c), upper)
        lower = torch.where(found, lower, torch.maximum(lower, c))
        c = torch.where(upper.isinf(), c * CW_GROWTH, (lower + upper) / 2)
    return best


def within_radius(x: torch.Tensor, x_adv: torch.Tensor, eps: float) -> torch.Tensor:
    """``x_adv`` where its L2 distance to x is at most eps, else x (both (B, C, H, W))."""
    inside = (x_adv - x).flatten(1).norm(dim=1) <= eps  # (B,)
    return torch.where(inside.view(-1, 1, 1, 1), x_adv, x)
