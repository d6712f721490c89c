"""Choosing the device once, for the command line (the library itself takes tensors'
devices), the process settings for it, and what machine it is: the CPU's model and flags,
the GPU's compute capability, native bf16, one description for checkpoints. Decisions on the
hardware are functions of plain values, so that a CPU test checks what a GPU would get."""
from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys
from functools import lru_cache
from pathlib import Path

import torch

# glibc mallopt() parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
CPUINFO = Path("/proc/cpuinfo")
# CPU flags (Linux names) of instructions that compute in bf16 natively; without them
# PyTorch emulates bf16 in float32 and autocast only adds conversions.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# NVIDIA GPUs compute bf16 natively from compute capability 8.0 (Ampere: A100, RTX 30xx) on.
BF16_MIN_CAPABILITY = (8, 0)
Capability = tuple[int, int]


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
    """Ask glibc's malloc to keep freed memory for reuse rather than ``mmap`` each large
    tensor afresh (PyTorch's CPU allocator has no cache; docs/performance.md), at the cost of
    a resident set that holds the peak. True if applied (Linux/glibc only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def backend_flags(device_type: str, deterministic: bool = False) -> dict:
    """The process settings :func:`tune_backends` applies on a device type: matrix products
    in IEEE float32 (no TF32: the prediction vectors and routing stay float32 as promised;
    cuDNN's convolutions keep torch's TF32 default), cuDNN autotuning unless
    ``deterministic``."""
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


@lru_cache(maxsize=1)
def cpu_info() -> tuple[str, frozenset[str]]:
    """(model name, flags) of the first CPU in /proc/cpuinfo; elsewhere the platform's
    processor string and no flags."""
    model, flags = "", frozenset()
    try:
        for line in CPUINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and not model:
                model = value.strip()
            elif key == "flags" and not flags:
                flags = frozenset(value.split())
            if model and flags:
                break
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


def has_native_bf16(device_type: str, capability: Capability | None = None,
                    cpu_flags: frozenset[str] = frozenset()) -> bool:
    """True where bf16 arithmetic runs natively: CUDA GPUs of compute capability 8.0 and
    later, CPUs with AVX512-BF16 or AMX."""
    if device_type == "cuda":
        return capability is not None and capability >= BF16_MIN_CAPABILITY
    return device_type == "cpu" and any(flag in cpu_flags for flag in BF16_CPU_FLAGS)


def native_bf16(device: torch.device) -> bool:
    """:func:`has_native_bf16` of ``device`` itself (e.g. cuda:1, not the current GPU)."""
    capability = (tuple(torch.cuda.get_device_capability(device)) if device.type == "cuda"
                  else None)
    return has_native_bf16(device.type, capability, cpu_info()[1])


def describe_machine(device_type: str, name: str, torch_version: str, *, threads: int | None = None,
                     capability: Capability | None = None, cuda: str | None = None,
                     cudnn: int | None = None, backends: dict | None = None) -> dict:
    """What the kernels a run computes with depend on. CPUs: the model and the thread
    count. GPUs: the model, compute capability, CUDA and cuDNN versions."""
    what = {"device": device_type, "name": name, "torch": torch_version}
    if device_type == "cuda":
        what.update(capability=list(capability) if capability else None, cuda=cuda, cudnn=cudnn)
    else:
        what["threads"] = threads
    if backends:
        what["backends"] = dict(backends)
    return what


def machine_description(device: torch.device) -> dict:
    """:func:`describe_machine` of ``device`` as this process runs it, with the process
    settings that change which kernels run (:func:`tune_backends`)."""
    backends = {"matmul": torch.get_float32_matmul_precision()}
    if device.type != "cuda":
        return describe_machine(device.type, cpu_info()[0], str(torch.__version__),
                                threads=torch.get_num_threads(), backends=backends)
    backends.update(cudnn_tf32=bool(torch.backends.cudnn.allow_tf32),
                    cudnn_deterministic=bool(torch.backends.cudnn.deterministic))
    return describe_machine("cuda", torch.cuda.get_device_name(device), str(torch.__version__),
                            capability=tuple(torch.cuda.get_device_capability(device)),
                            cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                            backends=backends)
