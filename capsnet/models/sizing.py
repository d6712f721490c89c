"""What a model will cost before anything is allocated: its parameters counted on the meta
device (no memory), a run's peak memory from one trace of its training steps and evaluation
on fake tensors (:func:`peak_estimate`), and the one-line error :func:`check_fits` raises
for a model that cannot fit this machine's memory (instead of the allocator's crash)."""
from __future__ import annotations

import os
import warnings
import weakref

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.func import functional_call
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from capsnet.config import ConfigError
from capsnet.losses import model_loss

FLOAT_BYTES = 4
# Training keeps the weights, their gradients and Adam's two moments: 4 copies.
TRAINING_COPIES = 4
GIB = 2 ** 30
# A model bigger than this gets a warning naming the scalable model (e.g. CapsNet's
# DigitCaps at 128x128: 313M parameters, almost all of them one matrix per primary capsule).
LARGE_PARAMETERS = 100_000_000
SCALABLE_MODEL = "capshead"


def memory_bytes() -> int:
    """This machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def meta_model(config) -> nn.Module:
    """The model for ``config`` on the meta device: shapes without memory."""
    from capsnet.models import entry_of  # the registry imports this module
    with torch.device("meta"):
        return entry_of(config).model(config)


def parameter_count(config) -> int:
    return sum(p.numel() for p in meta_model(config).parameters())


class LiveBytes(TorchDispatchMode):
    """The bytes of the tensor storages created inside this mode and still alive: ``current``
    and the ``peak`` since it was entered. Works on fake tensors (shapes only)."""

    def __init__(self):
        super().__init__()
        self.current = self.peak = 0
        self._live: dict[int, int] = {}

    def reset(self) -> None:
        """Start the peak again from what is alive now."""
        self.peak = self.current

    def _freed(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs))
                 if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in given or key in self._live or storage.nbytes() == 0:
                continue  # an input written in place or viewed, or known already
            self._live[key] = storage.nbytes()
            self.current += storage.nbytes()
            self.peak = max(self.peak, self.current)
            weakref.finalize(storage, self._freed, key)
        return out


def traced_peak_bytes(model: nn.Module, batch: int, eval_batch: int) -> tuple[int, int]:
    """(training, evaluation): the most bytes of tensors alive at once while ``model`` (as it
    will compute: its precision and kernels) takes a training step at ``batch`` with Adam's
    moments made (forward, loss, backward, Adam: a run's second step), and what evaluating a
    batch of ``eval_batch`` then adds to what the step left (the gradients and moments).
    Traced on fake tensors: shapes only, nothing allocated or computed; the weights (which
    exist already) are not counted."""
    config, device = model.config, next(model.parameters()).device
    was_training = model.training
    shape = (config.in_channels, config.image_size, config.image_size)
    with FakeTensorMode(allow_non_fake_inputs=True) as fake:
        weights = {name: fake.from_tensor(p).requires_grad_(p.requires_grad)
                   for name, p in model.named_parameters()}
        state = {**weights, **{name: fake.from_tensor(b) for name, b in model.named_buffers()}}
        optimizer = torch.optim.Adam(list(weights.values()))
        with LiveBytes() as live:
            for w in weights.values():  # a first step's gradients make Adam's moments
                w.grad = torch.zeros_like(w)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            model.train()
            x = torch.zeros(batch, *shape, device=device)  # (B, C, H, W)
            y = torch.zeros(batch, dtype=torch.long, device=device)  # (B,)
            model_loss(functional_call(model, state, (x, y)), x, y).backward()
            optimizer.step()
            del x, y
            training, held = live.peak, live.current
            live.reset()
            model.eval()
            with torch.no_grad():
                functional_call(model, state, (torch.zeros(eval_batch, *shape, device=device),))
    model.train(was_training)
    return training, live.peak - held


def peak_estimate(model: nn.Module, batch: int, eval_batch: int,
                  resident: tuple[int, int]) -> tuple[int, int]:
    """(peak, tensors): a run's peak memory per process, estimated from what is ``resident``
    (now, peak so far: the libraries, the data, the weights) and :func:`traced_peak_bytes`,
    and the part of it the tensors alive at once take. On a GPU the measure is
    the caching allocator's allocated bytes: the larger phase, which the trace counts. On a
    CPU it is the resident set, and glibc's heap (freed memory kept for reuse:
    capsnet.devices.keep_freed_memory) also holds the fragments between live tensors, which
    no trace of shapes sees and which depend on the order of every allocation (the OpenMP
    threads' timing included). There the estimate adds the phases, as if evaluation reused
    nothing training freed, an allowance for them: within 10% of the measured peak for
    CapsNet, Efficient-CapsNet and the capsule head, under it for EM, whose blocks of
    0.6-0.9 GiB fragment the heap further (results/notes/cpu-memory.md)."""
    now, peak = resident
    training, evaluation = traced_peak_bytes(model, batch, eval_batch)
    tensors = max(peak, now + max(training, evaluation))
    if next(model.parameters()).device.type == "cuda":
        return tensors, tensors
    return max(peak, now + training + evaluation), tensors


def untraced(device: torch.device, estimate: int, tensors: int) -> str:
    """What the trace cannot see, for the estimate's log line: on a CPU the heap's fragments,
    allowed for by what the ``estimate`` holds beyond the ``tensors``; nothing on a GPU."""
    if device.type != "cpu":
        return ""
    return (f"; {tensors / GIB:.2f} GiB of it without the heap's fragments, which vary from "
            f"run to run and can exceed the {(estimate - tensors) / GIB:.2f} GiB allowed")


def data_shape(config) -> str:
    return (f"{config.image_size}x{config.image_size}x{config.in_channels} images with "
            f"{config.num_classes} classes")


def check_fits(config, model_name: str) -> None:
    """ConfigError in one line when the model's weights alone exceed this machine's memory
    (naming the estimate and what to change); a warning for a model over LARGE_PARAMETERS."""
    parameters = parameter_count(config)
    weights = FLOAT_BYTES * parameters
    if weights > memory_bytes():
        raise ConfigError(
            f"{model_name} for {data_shape(config)} needs {parameters:,} parameters "
            f"({weights / GIB:.1f} GiB of weights, {TRAINING_COPIES * weights / GIB:.1f} GiB to "
            f"train), more than this machine's {memory_bytes() / GIB:.1f} GiB: use "
            f"'{SCALABLE_MODEL}' (class capsules shared across positions) or a smaller "
            f"image_size / num_classes")
    if parameters > LARGE_PARAMETERS and model_name != SCALABLE_MODEL:
        warnings.warn(f"{model_name} for {data_shape(config)} has {parameters:,} parameters; "
                      f"'{SCALABLE_MODEL}' shares the class capsules' matrices across "
                      f"positions and stays small", stacklevel=3)
