"""Data-parallel training across processes, as started by ``torchrun``, and the random
state a checkpoint keeps.

:func:`setup` reads torchrun's RANK, WORLD_SIZE and LOCAL_RANK, joins the process group
(NCCL on CUDA, gloo on CPU) and places each process on its local rank's device; without
them everything here is a no-op for one process. :func:`shard_order` deals each epoch's
global order out so that the ranks' k-th batches together are a single process's k-th."""
from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from capsnet.devices import pick_device
from capsnet.training.loop import EvalResult, evaluate

# Environment variables set by torchrun for each process.
ENV_RANK, ENV_WORLD_SIZE, ENV_LOCAL_RANK = "RANK", "WORLD_SIZE", "LOCAL_RANK"
CPU = torch.device("cpu")


@dataclass(frozen=True)
class World:
    """This process's global rank, the number of processes, its local rank and its device."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: torch.device = CPU
    owns_group: bool = False  # True when setup() created the process group

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that logs and writes files."""
        return self.rank == 0


def env_ranks() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun's environment; (0, 1, 0) without it."""
    rank = int(os.environ.get(ENV_RANK, 0))
    size = int(os.environ.get(ENV_WORLD_SIZE, 1))
    local_rank = int(os.environ.get(ENV_LOCAL_RANK, rank))
    if not 0 <= rank < size:
        raise ValueError(f"{ENV_RANK}={rank} is not within {ENV_WORLD_SIZE}={size}")
    return rank, size, local_rank


def backend_for(device: torch.device) -> str:
    """The collective backend for a device type: NCCL on CUDA GPUs, gloo on CPUs."""
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"distributed training runs on CUDA or CPU devices, not "
                         f"{device.type!r}")
    return "nccl" if device.type == "cuda" else "gloo"


def device_for(requested: str, local_rank: int, world_size: int) -> torch.device:
    """'auto' or index-less 'cuda' -> LOCAL_RANK's GPU when CUDA is available; else as given."""
    device = pick_device(requested)
    if world_size > 1 and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", cuda_index_for(local_rank, torch.cuda.device_count()))
    return device


def cuda_index_for(local_rank: int, visible: int) -> int:
    """The local rank's GPU index, or 0 when the process sees one GPU only (SLURM and the like)."""
    if visible == 1:
        return 0
    if not 0 <= local_rank < visible:
        raise ValueError(f"{ENV_LOCAL_RANK}={local_rank} but this process sees {visible} "
                         f"GPUs: start at most one process per GPU")
    return local_rank


def setup(requested_device: str = "auto") -> World:
    """Join the process group torchrun describes; one process gets World(size=1)."""
    if dist.is_available() and dist.is_initialized():
        rank, size = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get(ENV_LOCAL_RANK, rank))
        return World(rank, size, local_rank, device_for(requested_device, local_rank, size))
    rank, size, local_rank = env_ranks()
    device = device_for(requested_device, local_rank, size)
    if size == 1:
        return World(device=device)
    if not dist.is_available():
        raise ValueError(f"{ENV_WORLD_SIZE}={size} but this torch build has no torch.distributed")
    backend = backend_for(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend, rank=rank, world_size=size)
    return World(rank, size, local_rank, device, owns_group=True)


def teardown(world: World, wait_for_all: bool = False) -> None:
    """Leave the process group if :func:`setup` created it; ``wait_for_all`` meets at a barrier
    first, so that no rank tears down gloo's connections while another uses them."""
    if world.owns_group and dist.is_initialized():
        if wait_for_all:
            barrier(world)
        dist.destroy_process_group()


@contextlib.contextmanager
def local_main_first(world: World) -> Iterator[None]:
    """Run the body on local rank 0 of each machine first (e.g. a download), then on the others."""
    if world.distributed and world.local_rank != 0:
        barrier(world)
    yield
    if world.distributed and world.local_rank == 0:
        barrier(world)


def barrier(world: World) -> None:
    """Wait for every rank; under NCCL on this rank's own GPU (not the one NCCL would guess)."""
    own_gpu = world.device.type == "cuda" and world.device.index is not None
    dist.barrier(device_ids=[world.device.index] if own_gpu else None)


def per_rank_batch(global_batch: int, world: World) -> int:
    """The batch each rank trains on, so that the ranks together make ``global_batch``."""
    if global_batch % world.size:
        raise ValueError(f"batch size {global_batch} is not divisible by the "
                         f"{world.size} training processes")
    return global_batch // world.size


def shard_order(order: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's share (ceil(M / world),) of an epoch's order (M,): every ``world``-th index
    from ``rank``, padded with the first entries as DistributedSampler does."""
    M = order.numel()
    if M == 0:
        return order
    total = -(-M // world) * world  # M rounded up to a multiple of world
    padded = order.repeat(-(-total // M))[:total]  # (total,): order, then its first entries
    return padded[rank::world]  # (total / world,)


def all_reduce_sum(tensor: torch.Tensor, world: World) -> torch.Tensor:
    """The sum of ``tensor`` over all ranks (a new tensor; the input itself is unchanged)."""
    total = tensor.clone()
    if world.distributed:
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def all_reduce_mean(values: list[float], world: World) -> list[float]:
    """Element-wise means over ranks of a few Python numbers (e.g. epoch loss, accuracy)."""
    if not world.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=world.device)  # (K,)
    return (all_reduce_sum(t, world) / world.size).tolist()


def summer(world: World):
    """A function summing a tensor over the ranks (None in a single process)."""
    if not world.distributed:
        return None
    return lambda tensor: all_reduce_sum(tensor.to(world.device), world)


def evaluate_sharded(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                     world: World, num_classes: int, **kwargs) -> EvalResult:
    """:func:`~capsnet.training.loop.evaluate` with the examples dealt out to the ranks and
    the confusion matrix and loss summed: one process's numbers. ``model``: the plain module."""
    if not world.distributed:
        return evaluate(model, images, labels, **kwargs)
    N = labels.numel()
    idx = torch.arange(world.rank, N, world.size, device=labels.device)  # (~N / world,)
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.long, device=world.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=world.device)
    if idx.numel():
        part = evaluate(model, images[idx], labels[idx], **kwargs)
        confusion += part.confusion.to(world.device)  # (J, J)
        loss_sum += part.loss * idx.numel()
    confusion = all_reduce_sum(confusion, world).cpu()  # (J, J)
    loss = all_reduce_sum(loss_sum, world).item() / max(N, 1)
    accuracy = confusion.diag().sum().item() / max(N, 1)
    return EvalResult(accuracy, loss, confusion)


def wrap_model(model: nn.Module, world: World) -> nn.Module:
    """``model`` in DistributedDataParallel when there are several processes, else itself."""
    if not world.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [world.device] if world.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def broadcast_object(obj, world: World, src: int = 0):
    """Rank ``src``'s picklable ``obj`` on every rank (e.g. the final results)."""
    if not world.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, device=world.device)
    return box[0]


def rng_state(device: torch.device = CPU, world: World | None = None) -> dict:
    """The random state a checkpoint keeps, so that a resumed run draws what it would have:
    the CPU and Python generators and every rank's CUDA generator (``cuda_by_rank``; under
    DDP on GPUs every rank must call this, a gather)."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if device.type == "cuda":
        mine = torch.cuda.get_rng_state(device)  # (N,) uint8 on the CPU
        state["cuda_by_rank"] = [mine]
        if world is not None and world.distributed:
            state["cuda_by_rank"] = [None] * world.size
            dist.all_gather_object(state["cuda_by_rank"], mine)
    return state


def cuda_rng_state_for(state: dict, rank: int, device_index: int | None) -> torch.Tensor | None:
    """The saved CUDA generator state for ``rank`` (None for a larger world); earlier
    checkpoints' ``cuda`` holds one state per visible GPU."""
    if "cuda_by_rank" in state:
        saved = state["cuda_by_rank"]
        return saved[rank] if rank < len(saved) else None
    saved = state.get("cuda") or []
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
