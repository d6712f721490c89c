"""The random state a checkpoint keeps, so that a resumed run draws what it would have drawn:
the CPU and Python generators, and each rank's own CUDA generator (``cuda_by_rank``),
restored onto the device the run trains on or left out for another world size. Older
checkpoints' ``cuda`` (one state per visible GPU) is read the same careful way."""
from __future__ import annotations

import random

import torch

from capsnet.training import distributed
from capsnet.training.distributed import World

CPU = torch.device("cpu")


def rng_state(device: torch.device = CPU, world: World | None = None) -> dict:
    """The random state to save. Under DDP on GPUs every rank must call this (a gather)."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        mine = torch.cuda.get_rng_state(device)  # (N,) uint8 on the CPU
        state["cuda_by_rank"] = distributed.all_gather_objects(mine, world or World())
    return state


def cuda_rng_state_for(state: dict, rank: int, device_index: int | None) -> torch.Tensor | None:
    """The saved CUDA generator state for ``rank``, or None."""
    if "cuda_by_rank" in state:
        saved = state["cuda_by_rank"]
        return saved[rank] if rank < len(saved) else None
    saved = state.get("cuda") or []  # earlier checkpoints: one state per visible GPU
    index = device_index or 0
    return saved[index] if index < len(saved) else None


def set_rng_state(state: dict, device: torch.device = CPU, rank: int = 0) -> None:
    """Inverse of :func:`rng_state` for ``rank`` on ``device`` (states moved back to the CPU)."""
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    if device.type == "cuda":
        cuda = cuda_rng_state_for(state, rank, device.index)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda.cpu(), device)
