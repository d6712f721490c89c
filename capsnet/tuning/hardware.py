"""What machine this is: the CPU's model and flags, native bf16, one description for caches."""
from __future__ import annotations

import platform
from functools import lru_cache
from pathlib import Path

import torch

CPUINFO = Path("/proc/cpuinfo")
# CPU flags (Linux names) of instructions that compute in bf16 natively; without them
# PyTorch emulates bf16 in float32 and autocast only adds conversions.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


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


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_info()[0]


def native_bf16(device: torch.device) -> bool:
    """True where bf16 arithmetic runs natively: GPUs that compute in bf16 (compute
    capability 8.0 and later), CPUs with AVX512-BF16 or AMX. Timing still decides."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        return any(flag in cpu_info()[1] for flag in BF16_CPU_FLAGS)
    return False


def machine_description(device: torch.device) -> dict:
    """What a measured choice depends on: device and its model, threads, torch version."""
    return {"device": device.type, "name": device_name(device),
            "threads": torch.get_num_threads(), "torch": str(torch.__version__)}
