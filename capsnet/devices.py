"""Choosing the device once, for the command line; the library itself takes tensors' devices."""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

import torch

# glibc mallopt() parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


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


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to serve every allocation from its heap and keep freed memory
    for reuse instead of handing it back to the kernel. True if it was applied.

    PyTorch's CPU allocator has no cache: each large tensor is a fresh ``mmap`` whose pages
    fault in one by one, and a CapsNet step frees and re-allocates hundreds of MB. On the
    2-core benchmark machine this alone made a training step about 30% faster (see
    docs/performance.md). The cost is a higher resident set (it holds the peak), which is
    what a training process reaches anyway. Linux/glibc only; elsewhere nothing changes."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def tune_backends(device: torch.device, reuse_freed_memory: bool = True) -> None:
    """Process-wide speed settings for a training or benchmark run on ``device``:
    heap reuse for CPU tensors (``keep_freed_memory``), cuDNN autotuning for the
    fixed-size convolutions and TF32 matmuls on GPUs."""
    if device.type == "cpu" and reuse_freed_memory:
        keep_freed_memory()
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.set_float32_matmul_precision("high")
