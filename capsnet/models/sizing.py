"""What a model will cost before anything is allocated: its parameters counted on the meta
device (no memory), the bytes every operation of one training forward pass writes (an upper
bound of what backward keeps), and the one-line error :func:`check_fits` raises for a model
that cannot fit this machine's memory (instead of the allocator's crash)."""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from capsnet.config import ConfigError

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


class WrittenBytes(TorchDispatchMode):
    """Adds up the bytes of every tensor the operations inside it return."""

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.total += t.numel() * t.element_size()
        return out


def forward_bytes(config, batch: int) -> int:
    """Bytes written by one training-mode forward pass of ``batch`` images, on fake CPU
    tensors (shapes only, nothing allocated): an upper bound of what backward keeps."""
    from capsnet.models import entry_of  # the registry imports this module
    with FakeTensorMode():
        model = entry_of(config).model(config).train()
        images = torch.zeros(batch, config.in_channels, config.image_size, config.image_size)
        labels = torch.zeros(batch, dtype=torch.long)
        with WrittenBytes() as counter:
            try:
                model(images, labels)
            except TypeError:  # a model without labels (the CNNs)
                model(images)
    return counter.total


@dataclass(frozen=True)
class SizeEstimate:
    parameters: int
    training_bytes: int  # weights, gradients, Adam's moments
    forward_bytes: int | None  # one training forward at ``batch``; None: not estimated
    batch: int | None

    def describe(self) -> str:
        line = (f"{self.parameters:,} parameters ({self.training_bytes / GIB:.2f} GiB to train "
                f"with Adam)")
        if self.forward_bytes is not None:
            line += (f", at most {self.forward_bytes / GIB:.2f} GiB of activations at batch "
                     f"{self.batch}")
        return line


def estimate(config, batch: int | None = None) -> SizeEstimate:
    """Parameters and memory of training ``config``'s model (activations if ``batch``)."""
    parameters = parameter_count(config)
    activations = forward_bytes(config, batch) if batch else None
    return SizeEstimate(parameters, TRAINING_COPIES * FLOAT_BYTES * parameters, activations,
                        batch)


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
