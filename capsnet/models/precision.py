"""The arithmetic precision a model runs in: float32, or bf16 autocast where it pays.

A model carries its ``compute_dtype`` (None: float32); its ``forward`` runs under
:func:`autocast_to` that dtype, so training, evaluation and inference all run the same
kernels. Routing, squash and the losses stay in float32 (their modules cast).
"""
from __future__ import annotations

import contextlib

import torch

PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}


def precision_name(dtype: torch.dtype | None) -> str:
    """'fp32' or 'bf16' for a compute dtype (None is float32)."""
    return next(name for name, d in PRECISIONS.items() if d == dtype)


def autocast_to(device: torch.device | str, dtype: torch.dtype | None):
    """Autocast context for ``dtype`` on ``device``, or a no-op when dtype is None."""
    device_type = torch.device(device).type
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)
