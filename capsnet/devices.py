"""Choosing the device once, for the command line; the library itself takes tensors' devices."""
from __future__ import annotations

import torch


def pick_device(name: str = "auto") -> torch.device:
    """'auto' -> cuda, then mps, then cpu; anything else is passed to torch.device
    after checking that it is available."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r} requested but MPS is not available")
    return device


def tune_backends(device: torch.device) -> None:
    """Process-wide speed settings for a training or benchmark run on ``device``:
    cuDNN autotuning for the fixed-size convolutions and TF32 matmuls on GPUs."""
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("high")
