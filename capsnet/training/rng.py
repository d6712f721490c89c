"""The random state a checkpoint keeps, so that a resumed run draws what it would have drawn.

Kept: the CPU generator's state and Python's, and for a run on a GPU the state of each
rank's own CUDA generator (``cuda_by_rank``: rank 0 writes the checkpoint, so the ranks'
states are gathered first). Nothing here depends on how many GPUs the resuming machine
has: a state is restored onto the device the run trains on, or left out when the
checkpoint has none for this rank (another world size), never indexed by the GPUs that
were visible when it was saved. Checkpoints of earlier versions kept ``cuda``: one state
per GPU then visible, which is read the same careful way.
"""
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
    """The saved CUDA generator state for this ``rank`` (on the GPU ``device_index``), or
    None when the checkpoint holds none for it."""
    if "cuda_by_rank" in state:
        saved = state["cuda_by_rank"]
        return saved[rank] if rank < len(saved) else None
    saved = state.get("cuda") or []  # earlier checkpoints: one state per visible GPU
    index = device_index or 0
    return saved[index] if index < len(saved) else None


def set_rng_state(state: dict, device: torch.device = CPU, rank: int = 0) -> None:
    """Inverse of :func:`rng_state` for the process of ``rank`` training on ``device``.
    RNG states must be CPU byte tensors; a checkpoint loaded with map_location='cuda' has
    moved them to the GPU: they are brought back."""
    torch.set_rng_state(state["torch"].cpu())
    random.setstate(state["python"])
    if device.type == "cuda":
        cuda = cuda_rng_state_for(state, rank, device.index)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda.cpu(), device)
