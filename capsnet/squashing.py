"""The capsule non-linearities, safe at zero and for huge vectors: ``squash`` (Sabour et al.
2017, Eq. 1) and Efficient-CapsNet's ``exp_squash`` (Mazzia, Salvetti & Chiaberge 2021,
"Primary capsules"): (1 - 1 / e^|s|) s / |s|, which saturates faster (half length at
|s| = ln 2 instead of 1) and is close to the identity for short vectors. A leaf module: the
layers and the routers both use it."""
from __future__ import annotations

import torch

# Added under the square root so that the gradient at s = 0 stays finite.
SQUASH_EPS = 1e-12


def full_precision(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 when it is in a 16-bit float type (autocast), else as it is."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """v = |s|^2 / (1 + |s|^2) * s / |s| along ``dim``, same shape, lengths in [0, 1); the
    vector is scaled by its largest entry first (detached: the result does not depend on it),
    so that no square overflows."""
    scale = s.detach().abs().amax(dim=dim, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
    t = s / scale  # entries in [-1, 1]
    t_norm = torch.sqrt(t.pow(2).sum(dim=dim, keepdim=True) + SQUASH_EPS)
    n2 = (scale * t_norm).pow(2)  # |s|^2, inf for huge vectors
    # |s|^2 / (1 + |s|^2): written directly for short vectors (no cancellation), and as
    # 1 - 1 / (1 + |s|^2) for long ones (no inf / inf); each branch sees safe inputs only.
    short = n2 < 1
    factor = torch.where(short, n2 / (1 + n2.masked_fill(~short, 0)), 1 - 1 / (1 + n2))
    return t / t_norm * factor


# Short vectors use the factor's Taylor series (1 - e^-n) / n = 1 - n/2 + n^2/6 - n^3/24 +
# n^4/120: exact at s = 0 (where the gradient is the identity), free of the closed form's
# 0/0. Its relative truncation error is below n^5 / SERIES_ERROR_DENOMINATOR (6! = 720); the
# closed form 1 - e^-n loses eps / n to cancellation (expm1 would lose nothing, but ONNX has
# no expm1). The two errors are equal at n = (720 eps)^(1/6), where the series stops: 0.19 in
# float32 (relative error 3e-7 at most), 0.0066 in float64 (2e-14).
SERIES_ERROR_DENOMINATOR = 720


def exp_squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """v = (1 - e^-|s|) s / |s| along ``dim``, same shape, lengths in [0, 1); long vectors
    scaled by their largest entry first, short ones by a Taylor series, so no NaN gradient."""
    scale = s.detach().abs().amax(dim=dim, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
    t = s / scale  # entries in [-1, 1], the largest is +-1 unless s == 0
    t_norm = torch.linalg.vector_norm(t, dim=dim, keepdim=True)  # in [1, sqrt(D)] or 0
    n = scale * t_norm  # |s|, inf only for entries near the float limit
    short = n < (SERIES_ERROR_DENOMINATOR * torch.finfo(s.dtype).eps) ** (1 / 6)
    n_short = n.masked_fill(~short, 0)
    series = 1 - n_short / 2 * (1 - n_short / 3 * (1 - n_short / 4 * (1 - n_short / 5)))
    direction = t / t_norm.masked_fill(short, 1)  # s / |s| for the long vectors
    return torch.where(short, s * series, direction * (1 - torch.exp(-n)))
