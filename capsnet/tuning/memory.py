"""How much memory a training step takes, measured rather than modelled.

A copy of the model runs one training step (forward, loss, backward) at two small batches
(``PROBE_BATCHES``); the peak grows linearly with the batch, so the two peaks give a fixed
part and a part per image, which are extrapolated to the run's batch. Adam's two moments
(twice the parameters' bytes) come on top. What the peak counts:

- on CUDA: ``torch.cuda.max_memory_allocated`` over the step (cuDNN's workspaces included;
  the CUDA context and the allocator's cached blocks are not);
- elsewhere: the peak bytes of live tensors (:class:`LiveTensorBytes`: every storage an
  operator creates, from its creation until it is freed), which is what
  ``max_memory_allocated`` reports on a GPU; oneDNN's scratch memory and the C heap's slack
  are not in it, so a process's resident set is higher.
"""
from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from capsnet.losses import model_loss

GIB = 2**30
MIB = 2**20
PROBE_BATCHES = (8, 16)  # two small batches: the fixed part and the part per image
ADAM_MOMENTS = 2  # Adam keeps two tensors the size of each parameter
# Of a GPU's memory, the share torch's caching allocator can use (fragmentation), and what
# the CUDA context and libraries take outside it.
GPU_USABLE_SHARE = 0.9
GPU_CONTEXT_BYTES = 512 * 2**20


class MemoryExceeded(RuntimeError):
    """A run that ran out of device memory, said in one line with the estimate."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes at the peak of a training step of ``batch_size`` images: ``fixed`` (weights,
    Adam's moments and the step's part that does not grow with the batch), ``per_image``
    times the batch, and ``resident`` (already on the device: the dataset)."""

    batch_size: int
    fixed: int
    per_image: int
    weights_and_adam: int = 0
    resident: int = 0

    @property
    def total(self) -> int:
        return self.resident + self.fixed + self.per_image * self.batch_size

    def largest_batch(self, capacity: int) -> int:
        """The largest batch whose estimate fits in ``capacity`` bytes (0 if none does)."""
        room = capacity - self.resident - self.fixed
        if room < self.per_image:
            return 0
        return room // max(1, self.per_image)

    def describe(self) -> str:
        """One line for the run log."""
        resident = f", already on the device {self.resident / GIB:.2f} GiB" if self.resident else ""
        return (f"about {self.total / GIB:.2f} GiB at batch {self.batch_size} per process "
                f"(weights and Adam {self.weights_and_adam / GIB:.2f} GiB, "
                f"{self.per_image / MIB:.1f} MiB an image{resident}; one step measured at "
                f"batches {PROBE_BATCHES[0]} and {PROBE_BATCHES[1]}, extrapolated)")


class LiveTensorBytes(TorchDispatchMode):
    """Bytes of tensor storages on ``device_type`` created under this mode and still alive:
    ``current`` and the ``peak`` since it was entered (or :meth:`reset`)."""

    def __init__(self, device_type: str = "cpu"):
        super().__init__()
        self.device_type = device_type
        self.current = self.peak = 0
        self._live: dict[int, int] = {}

    def reset(self) -> None:
        self.peak = self.current

    def _freed(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                 if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in given or key in self._live or storage.nbytes() == 0:
                continue  # an input written in place or viewed, or known already
            self._live[key] = storage.nbytes()
            self.current += storage.nbytes()
            self.peak = max(self.peak, self.current)
            weakref.finalize(storage, self._freed, key)
        return out


def step_peak(model: nn.Module, device: torch.device, batch_size: int) -> int:
    """Peak bytes one training step (forward, loss, backward) of ``model`` at ``batch_size``
    random images adds to what is already there (see the module docstring); the
    gradients are left set."""
    cfg = model.config
    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.rand(batch_size, cfg.in_channels, cfg.image_size, cfg.image_size,
                   device=device, generator=generator)  # (b, C, H, W)
    y = torch.randint(0, cfg.num_classes, (batch_size,), device=device, generator=generator)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        model_loss(model(x, y), x, y).backward()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    live = LiveTensorBytes(device.type)
    with live:
        model_loss(model(x, y), x, y).backward()
    return live.peak


def measure_training_memory(model: nn.Module, batch_size: int, resident: int = 0
                            ) -> MemoryEstimate:
    """The peak of one training step of ``model`` at ``batch_size`` (module docstring),
    measured on a copy: the model, its gradients, BatchNorm statistics and the random state
    are left as they were."""
    device = next(model.parameters()).device
    probe = copy.deepcopy(model).train()
    peaks = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for b in PROBE_BATCHES:
            probe.zero_grad(set_to_none=True)
            peaks.append(step_peak(probe, device, b))
    del probe
    small, large = PROBE_BATCHES
    per_image = max(0, (peaks[1] - peaks[0]) // (large - small))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    weights_and_adam = weights + ADAM_MOMENTS * sum(
        p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    fixed = weights_and_adam + max(0, peaks[0] - small * per_image)
    return MemoryEstimate(batch_size, fixed, per_image, weights_and_adam, resident)


def device_memory(device: torch.device) -> int | None:
    """A GPU's memory in bytes; None for other devices."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory


def usable_gpu_bytes(total: int) -> int:
    """Of a GPU's ``total`` bytes, what a run's tensors can count on."""
    return max(0, int(GPU_USABLE_SHARE * total) - GPU_CONTEXT_BYTES)


def out_of_memory_message(device: str, estimate: MemoryEstimate, total: int | None,
                          fits: int) -> str:
    """The one line a run that ran out of device memory ends with."""
    capacity = f" of the GPU's {total / GIB:.1f} GiB" if total else ""
    advice = (f"the largest batch estimated to fit is about {fits} (--batch-size {fits})"
              if fits else "not even one image fits: use a smaller preset, --precision bf16 "
              "(or fp16), or a larger GPU")
    return (f"{device} ran out of memory at batch {estimate.batch_size} per process: the "
            f"estimate is {estimate.total / GIB:.2f} GiB{capacity}; {advice}. The checkpoints "
            f"of the epochs before are intact")
