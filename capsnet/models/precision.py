"""The arithmetic precision a model runs in: float32, or bf16 / fp16 autocast where it pays.

A model carries its ``compute_dtype`` (None: float32); its ``forward`` runs under
:func:`autocast_to` that dtype, so training, evaluation and inference all run the same
kernels. Routing, squash and the losses stay in float32 (their modules cast). fp16 (for
GPUs without native bf16: V100, T4) trains with gradient scaling (:func:`grad_scaler_for`):
its 5 exponent bits would flush small gradients to zero.
"""
from __future__ import annotations

import contextlib

import torch

PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16,
                                             "fp16": torch.float16}


def precision_name(dtype: torch.dtype | None) -> str:
    """'fp32', 'bf16' or 'fp16' for a compute dtype (None is float32)."""
    return next(name for name, d in PRECISIONS.items() if d == dtype)


def autocast_to(device: torch.device | str, dtype: torch.dtype | None):
    """Autocast context for ``dtype`` on ``device``, or a no-op when dtype is None."""
    device_type = torch.device(device).type
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


def needs_grad_scaling(dtype: torch.dtype | None) -> bool:
    """True for fp16, whose narrow exponent needs the loss scaled before backward."""
    return dtype == torch.float16


def grad_scaler_for(device: torch.device | str, dtype: torch.dtype | None):
    """A ``torch.amp.GradScaler`` for training in ``dtype`` on ``device``, or None when the
    precision needs none (float32, bf16)."""
    if not needs_grad_scaling(dtype):
        return None
    return torch.amp.GradScaler(torch.device(device).type)
