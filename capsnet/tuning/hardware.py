"""What machine this is: the CPU's model and flags, the GPU's name and compute capability,
whether it computes bf16 natively, one description for checkpoints.

Every decision that depends on the hardware is a function of plain values (a device type,
a capability tuple, a set of CPU flags), so that a CPU test checks what a GPU would get;
the functions taking a ``torch.device`` only read those values and pass them on.
"""
from __future__ import annotations

import platform
from functools import lru_cache
from pathlib import Path

import torch

CPUINFO = Path("/proc/cpuinfo")
# CPU flags (Linux names) of instructions that compute in bf16 natively; without them
# PyTorch emulates bf16 in float32 and autocast only adds conversions.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# NVIDIA GPUs compute bf16 natively from compute capability 8.0 (Ampere: A100, RTX 30xx) on.
BF16_MIN_CAPABILITY = (8, 0)
Capability = tuple[int, int]


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


def gpu_capability(device: torch.device) -> Capability | None:
    """(major, minor) compute capability of ``device`` itself (not of the current GPU), or
    None for anything but a CUDA device."""
    if device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(device))


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_info()[0]


def has_native_bf16(device_type: str, capability: Capability | None = None,
                    cpu_flags: frozenset[str] = frozenset()) -> bool:
    """True where bf16 arithmetic runs natively: CUDA GPUs of compute capability 8.0 and
    later, CPUs with AVX512-BF16 or AMX."""
    if device_type == "cuda":
        return capability is not None and capability >= BF16_MIN_CAPABILITY
    return device_type == "cpu" and any(flag in cpu_flags for flag in BF16_CPU_FLAGS)


def native_bf16(device: torch.device) -> bool:
    """:func:`has_native_bf16` of ``device`` (the GPU named, e.g. cuda:1)."""
    return has_native_bf16(device.type, gpu_capability(device), cpu_info()[1])


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


def backend_settings(device_type: str) -> dict:
    """The process-wide settings that change which kernels run (see
    :func:`capsnet.devices.tune_backends`)."""
    settings = {"matmul": torch.get_float32_matmul_precision()}
    if device_type == "cuda":
        settings.update(cudnn_tf32=bool(torch.backends.cudnn.allow_tf32),
                        cudnn_deterministic=bool(torch.backends.cudnn.deterministic))
    return settings


def machine_description(device: torch.device) -> dict:
    """:func:`describe_machine` of ``device`` as this process runs it."""
    if device.type == "cuda":
        return describe_machine("cuda", device_name(device), str(torch.__version__),
                                capability=gpu_capability(device), cuda=torch.version.cuda,
                                cudnn=torch.backends.cudnn.version(),
                                backends=backend_settings("cuda"))
    return describe_machine(device.type, device_name(device), str(torch.__version__),
                            threads=torch.get_num_threads(),
                            backends=backend_settings(device.type))
