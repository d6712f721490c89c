"""The device's facts for benchmarks/gpu_campaign.py, as one JSON line: torch and CUDA
versions, the GPU's name, capability, memory and bf16 support, the CPU cores.

    python -m benchmarks.campaign_health cuda
"""
from __future__ import annotations

import json
import os
import sys

import torch


def device_facts(name: str) -> dict:
    facts = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
             "cpu_cores": os.cpu_count()}
    if name.startswith("cuda") and torch.cuda.is_available():
        device = torch.device(name)
        props = torch.cuda.get_device_properties(device)
        facts.update(name=props.name, capability=list(torch.cuda.get_device_capability(device)),
                     memory_gib=round(props.total_memory / 2**30, 1),
                     multiprocessors=props.multi_processor_count, cuda=torch.version.cuda,
                     cudnn=torch.backends.cudnn.version(), gpus=torch.cuda.device_count(),
                     bf16=torch.cuda.is_bf16_supported())
    return facts


if __name__ == "__main__":
    print(json.dumps(device_facts(sys.argv[1] if len(sys.argv) > 1 else "cpu")), flush=True)
