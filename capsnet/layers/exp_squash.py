"""Efficient-CapsNet's squash (Mazzia, Salvetti & Chiaberge 2021, Methods, "Primary capsules"):

    squash(s) = (1 - 1 / e^|s|) * s / |s|

It saturates faster than Sabour et al.'s |s|^2 / (1 + |s|^2) (half length at |s| = ln 2
instead of 1) and is close to the identity for short vectors (the factor (1 - e^-|s|) / |s|
tends to 1), where Sabour's shrinks them quadratically. The public code (EscVM/
Efficient-CapsNet, utils/layers.py, class ``Squash``) writes it as
``(1 - 1/(exp(n) + eps)) * (s / (n + eps))`` with eps = 1e-20.
"""
from __future__ import annotations

import torch

# Below this length the factor (1 - e^-n) / n is its Taylor series up to n^4 / 120 (relative
# truncation error below n^5 / 720 = 1.4e-8): exact at s = 0 (where the gradient is the
# identity) and free of the 0/0 of the closed form. Above it, 1 - e^-n loses at most
# float32's 6e-8 / n = 6e-7 to cancellation (expm1 would lose nothing, but ONNX has no expm1).
SHORT_LENGTH = 0.1


def exp_squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """v = (1 - e^-|s|) s / |s| along ``dim``; input any shape (..., D, ...), output the
    same shape with lengths in [0, 1).

    Long vectors: the direction is computed from ``s`` divided by its largest absolute
    entry (detached, so the gradient is exact), so no square overflows even for entries
    near the float32 limit. Short vectors (|s| < SHORT_LENGTH): s times the Taylor series
    of the factor. Each branch sees only safe inputs, so no NaN reaches a gradient.
    """
    scale = s.detach().abs().amax(dim=dim, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
    t = s / scale  # entries in [-1, 1], the largest is +-1 unless s == 0
    t_norm = torch.linalg.vector_norm(t, dim=dim, keepdim=True)  # in [1, sqrt(D)] or 0
    n = scale * t_norm  # |s|, inf only for entries near the float limit
    short = n < SHORT_LENGTH
    n_short = n.masked_fill(~short, 0)
    series = 1 - n_short / 2 * (1 - n_short / 3 * (1 - n_short / 4 * (1 - n_short / 5)))
    direction = t / t_norm.masked_fill(short, 1)  # s / |s| for the long vectors
    return torch.where(short, s * series, direction * (1 - torch.exp(-n)))
