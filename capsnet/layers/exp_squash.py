"""Efficient-CapsNet's squash (Mazzia et al. 2021): squash(s) = (1 - 1 / e^|s|) s / |s|."""
from __future__ import annotations

import torch

# Short vectors use the factor's Taylor series (1 - e^-n) / n = 1 - n/2 + ... + n^4/120, whose
# error n^5 / 720 equals the closed form's cancellation eps / n at n = (720 eps)^(1/6) (0.19 in
# float32), where the series stops (ONNX has no expm1).
SERIES_ERROR_DENOMINATOR = 720


def short_length(dtype: torch.dtype) -> float:
    """The length below which :func:`exp_squash` uses the series, for ``dtype``."""
    return (SERIES_ERROR_DENOMINATOR * torch.finfo(dtype).eps) ** (1 / 6)


def exp_squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """v = (1 - e^-|s|) s / |s| along ``dim``, same shape, lengths in [0, 1); long vectors
    scaled by their largest entry first, short ones by a Taylor series, so no NaN gradient."""
    scale = s.detach().abs().amax(dim=dim, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
    t = s / scale  # entries in [-1, 1], the largest is +-1 unless s == 0
    t_norm = torch.linalg.vector_norm(t, dim=dim, keepdim=True)  # in [1, sqrt(D)] or 0
    n = scale * t_norm  # |s|, inf only for entries near the float limit
    short = n < short_length(s.dtype)
    n_short = n.masked_fill(~short, 0)
    series = 1 - n_short / 2 * (1 - n_short / 3 * (1 - n_short / 4 * (1 - n_short / 5)))
    direction = t / t_norm.masked_fill(short, 1)  # s / |s| for the long vectors
    return torch.where(short, s * series, direction * (1 - torch.exp(-n)))
