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
    if device.type == "cuda":
        check_cuda_device(device, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {name!r} requested but MPS is not available")
    return device


def check_cuda_device(device: torch.device, visible: int) -> None:
    """ValueError (one line) when ``device`` is not among the ``visible`` CUDA GPUs."""
    if visible == 0:
        raise ValueError(f"device {str(device)!r} requested but CUDA is not available "
                         f"(no GPU visible to torch {torch.__version__}); use --device cpu")
    if device.index is not None and device.index >= visible:
        raise ValueError(f"device {str(device)!r} requested but only {visible} CUDA "
                         f"device{'s are' if visible > 1 else ' is'} visible "
                         f"(cuda:0{f'..cuda:{visible - 1}' if visible > 1 else ''})")


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


def backend_flags(device_type: str, deterministic: bool = False) -> dict:
    """The process settings :func:`tune_backends` applies on a device type.

    Matrix products stay IEEE float32 everywhere ("highest"): DigitCaps' prediction
    vectors, the routing and (in a float32 plan) the decoder are float32 as the model
    promises, not TF32 on Ampere and later GPUs. cuDNN autotunes the fixed-size
    convolutions unless ``deterministic`` asks for reproducible algorithms instead; its
    convolutions keep torch's default of TF32 on those GPUs (the arithmetic-heavy part,
    where a bf16 plan goes further anyway)."""
    flags = {"matmul_precision": "highest"}
    if device_type == "cuda":
        flags.update(cudnn_benchmark=not deterministic, cudnn_deterministic=deterministic)
    return flags


def tune_backends(device: torch.device, reuse_freed_memory: bool = True,
                  deterministic: bool = False) -> None:
    """Process-wide settings for a run on ``device`` (training, evaluation, a benchmark):
    heap reuse for CPU tensors (``keep_freed_memory``) and :func:`backend_flags`."""
    if device.type == "cpu" and reuse_freed_memory:
        keep_freed_memory()
    flags = backend_flags(device.type, deterministic)
    torch.set_float32_matmul_precision(flags["matmul_precision"])
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = flags["cudnn_benchmark"]
        torch.backends.cudnn.deterministic = flags["cudnn_deterministic"]


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (a no-op on a CPU): before reading a clock."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
