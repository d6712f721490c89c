"""The squash non-linearity (Sabour et al. 2017, Eq. 1), safe at zero and for huge vectors."""
from __future__ import annotations

import torch

# Added under the square root so that the gradient at s = 0 stays finite.
SQUASH_EPS = 1e-12


def full_precision(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 when it is in a 16-bit float type (autocast), else as it is."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """v = |s|^2 / (1 + |s|^2) * s / |s| along ``dim``; same shape, lengths in [0, 1).

    The vector is first divided by its largest entry (detached: the gradient stays exact),
    so no square overflows and short vectors do not cancel."""
    scale = s.detach().abs().amax(dim=dim, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
    t = s / scale  # entries in [-1, 1]
    t_norm = torch.sqrt(t.pow(2).sum(dim=dim, keepdim=True) + SQUASH_EPS)
    n2 = (scale * t_norm).pow(2)  # |s|^2, inf for huge vectors
    # |s|^2 / (1 + |s|^2): written directly for short vectors (no cancellation), and as
    # 1 - 1 / (1 + |s|^2) for long ones (no inf / inf); each branch sees safe inputs only.
    short = n2 < 1
    factor = torch.where(short, n2 / (1 + n2.masked_fill(~short, 0)), 1 - 1 / (1 + n2))
    return t / t_norm * factor
