"""The Square attack (Andriushchenko et al. 2020), L-inf: a gradient-free random search
that changes one random square of the perturbation to a random corner of the eps-ball per
query and keeps it when the loss rises. It reads only the model's outputs, so it is the
check against gradient masking: it must not beat PGD.
"""
from __future__ import annotations

import math

import torch

from capsnet.attacks.threat import Objective

SQUARE_QUERIES = 1000
P_INIT = 0.05  # the paper's initial fraction of pixels changed per query (MNIST: 0.3 for 10k)
# The square's area halves at these fractions of a 10,000-query budget (the paper's schedule).
P_HALVINGS = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)
REFERENCE_QUERIES = 10_000


def square_fraction(query: int, queries: int, p_init: float = P_INIT) -> float:
    """The fraction of pixels in the square at ``query`` of ``queries`` (the paper's
    piecewise-constant schedule, rescaled to the budget)."""
    at = query * REFERENCE_QUERIES / max(queries, 1)
    return p_init / 2 ** sum(at > h for h in P_HALVINGS)


def _corner_signs(shape: tuple[int, ...], generator, device) -> torch.Tensor:
    return 2 * torch.randint(0, 2, shape, generator=generator, device=device).float() - 1


@torch.no_grad()
def square_linf(objective: Objective, x: torch.Tensor, eps: float,
                queries: int = SQUARE_QUERIES, p_init: float = P_INIT,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """Adversarial images (B, C, H, W) within eps (L-inf) of x, found with ``queries``
    forward passes at most per image; examples stop being queried once fooled."""
    x = x.detach().float()
    B, C, H, W = x.shape
    # initialisation: vertical stripes of +-eps (the paper's)
    x_best = (x + eps * _corner_signs((B, C, 1, W), generator, x.device)).clamp(0, 1)
    loss_best, fooled = objective(x_best)
    for query in range(queries):
        idx = (~fooled).nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        side = max(1, min(H, round(math.sqrt(square_fraction(query, queries, p_init) * H * W))))
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
