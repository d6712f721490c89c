"""How a model computes on the machine at hand, by a rule, and how much memory its training
step takes, measured.

The speed plan (nothing is timed): precision 'auto' is bf16 autocast where the device
computes bf16 natively (CPUs with AVX512-BF16 or AMX, CUDA GPUs from compute capability 8.0),
else float32; conv_impl 'auto' is the per-kernel-row GEMMs on a CPU
(:mod:`capsnet.layers.gemm_conv`), PyTorch's convolution (cuDNN) elsewhere.

The memory estimate: a copy of the model trains with its own Adam as ``train_one_epoch``
orders a step (forward and loss with the last step's gradients still held, ``zero_grad``,
backward, Adam's step) at two small batches (``PROBE_BATCHES``); each phase's peak is a
fixed part plus a part per image, and the estimate is the largest phase at the run's batch
plus the weights. Peaks: CUDA's ``max_memory_allocated``; elsewhere live tensors' bytes
(:class:`LiveTensorBytes`, without oneDNN's scratch memory or the C heap's slack).
"""
from __future__ import annotations

import contextlib
import copy
import weakref
from dataclasses import asdict, dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from capsnet.devices import machine_description, native_bf16, tune_backends
from capsnet.layers.gemm_conv import CONV_IMPLS, GemmConv2d
from capsnet.losses import model_loss
from capsnet.models.base import PRECISIONS, precision_name

AUTO = "auto"


@dataclass
class SpeedPlan:
    """How a model runs on a machine: its precision, each convolution's implementation,
    where the choice came from ('rule', 'given' when the flags fixed it, 'checkpoint' for a
    resumed run) and the machine it was made for."""

    precision: str
    conv_impls: dict[str, str]
    source: str = "given"
    machine: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> SpeedPlan:
        """A plan from :meth:`as_dict` (older checkpoints' extra keys are ignored)."""
        return cls(**{k: values[k] for k in cls.__dataclass_fields__ if k in values})

    def describe(self) -> str:
        """One line for the run log."""
        convs = ", ".join(f"{name} {impl}" for name, impl in self.conv_impls.items())
        how = {"rule": "the rule for this device", "checkpoint": "kept from the resumed run",
               "given": "as given"}.get(self.source, self.source)
        return f"precision {self.precision}; convolutions: {convs or 'none'} ({how})"


def conv_layers(model: nn.Module) -> list[tuple[str, GemmConv2d]]:
    """The model's convolutions whose path can be chosen, in the order forward runs them."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, GemmConv2d)]


def apply_plan(model: nn.Module, plan: SpeedPlan) -> None:
    """Make ``model`` run as ``plan`` says: its precision and its layers' implementations."""
    for name, conv in conv_layers(model):
        if name in plan.conv_impls:
            conv.set_impl(plan.conv_impls[name])
    model.compute_dtype = PRECISIONS[plan.precision]


def current_plan(model: nn.Module) -> SpeedPlan:
    """The plan a model runs with now."""
    return SpeedPlan(precision_name(getattr(model, "compute_dtype", None)),
                     {name: conv.impl for name, conv in conv_layers(model)})


def rule_precision(device: torch.device) -> str:
    """'bf16' where ``device`` computes bf16 natively, else 'fp32'."""
    return "bf16" if native_bf16(device) else "fp32"


def choose_plan(model: nn.Module, device: torch.device, *, precision: str = AUTO,
                conv_impl: str = AUTO) -> SpeedPlan:
    """The plan for ``model`` on ``device``: ``precision`` ('auto', 'fp32', 'bf16', 'fp16')
    and ``conv_impl`` ('auto' or one of CONV_IMPLS), 'auto' filled by the rule (module
    docstring). The model is left as it was; :func:`apply_plan` applies the result."""
    if precision != AUTO and precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose from auto, "
                         f"{', '.join(PRECISIONS)}")
    if conv_impl != AUTO and conv_impl not in CONV_IMPLS:
        raise ValueError(f"unknown conv implementation {conv_impl!r}; choose from auto, "
                         f"{', '.join(CONV_IMPLS)}")
    wanted = conv_impl if conv_impl != AUTO else "gemm" if device.type == "cpu" else "native"
    impls = {}
    for name, conv in conv_layers(model):
        available = conv.candidates(device)
        # "gemm" off the CPU: PyTorch's convolution, in the layout "gemm" keeps its weights in
        impls[name] = wanted if wanted in available else "channels_last"
    chosen = rule_precision(device) if precision == AUTO else precision
    source = "rule" if AUTO in (precision, conv_impl) else "given"
    return SpeedPlan(chosen, impls, source, machine_description(device))


def tune_for_inference(model: nn.Module, device: torch.device, precision: str = AUTO,
                       conv_impl: str = AUTO) -> SpeedPlan:
    """Choose and apply the plan of ``model`` for inference (the same rule as training)."""
    plan = choose_plan(model, device, precision=precision, conv_impl=conv_impl)
    apply_plan(model, plan)
    return plan


def tune(model: nn.Module, device: torch.device | str | None = None, precision: str = AUTO,
         conv_impl: str = AUTO) -> SpeedPlan:
    """Make ``model`` compute as ``capsnet train`` makes it on ``device`` (default: where its
    parameters are), for a training loop or inference of your own: the process settings
    (:func:`capsnet.devices.tune_backends`) and the plan of :func:`choose_plan` applied. Returns
    the plan; ``plan.describe()`` says what was chosen (e.g. bf16 where the device has it)."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    tune_backends(device)
    return tune_for_inference(model, device, precision, conv_impl)


GIB = 2**30
MIB = 2**20
# two small batches: the fixed part and the part per image (at 8 some steps are not yet linear)
PROBE_BATCHES = (16, 32)
ADAM_MOMENTS = 2  # Adam keeps two tensors the size of each parameter
# Of a GPU's memory, the share torch's caching allocator can use (fragmentation), and what
# the CUDA context and libraries take outside it.
GPU_USABLE_SHARE = 0.9
GPU_CONTEXT_BYTES = 512 * 2**20


class MemoryExceeded(RuntimeError):
    """A run that ran out of device memory, said in one line with the estimate."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes at the peak of a training step of ``batch_size`` images: the largest of the
    step's phases, each ``fixed + per_image * batch`` (the weights, gradients and Adam's
    moments in ``fixed``), plus ``resident`` (already on the device: the dataset)."""

    batch_size: int
    phases: tuple[tuple[int, int], ...]  # (fixed, per_image) of forward, backward, Adam's step
    weights_and_adam: int = 0
    resident: int = 0

    @property
    def peak_phase(self) -> tuple[int, int]:
        """(fixed, per_image) of the phase that peaks at ``batch_size``."""
        return max(self.phases, key=lambda phase: phase[0] + phase[1] * self.batch_size)

    @property
    def fixed(self) -> int:
        return self.peak_phase[0]

    @property
    def per_image(self) -> int:
        return self.peak_phase[1]

    @property
    def total(self) -> int:
        return self.resident + self.fixed + self.per_image * self.batch_size

    def largest_batch(self, capacity: int) -> int:
        """The largest batch whose estimate fits in ``capacity`` bytes (0 if none does)."""
        room = capacity - self.resident
        return max(0, min((room - fixed) // max(1, per_image) for fixed, per_image in self.phases))

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


def probe_steps(cuda: bool) -> tuple[int, ...]:
    """The probe's batches in order; the second and the last are measured. The first step
    makes gradients and Adam's moments. On CUDA a shape's first step also runs cuDNN's
    algorithm search (benchmark mode), whose trial workspaces are no part of a step:
    measured on an H200 they made the fp32 estimate 6.7 times the epochs' peak."""
    small, large = PROBE_BATCHES
    return (small, small, large, large) if cuda else (small, small, large)


def step_phase_peaks(model: nn.Module, device: torch.device) -> list[tuple[int, int, int]]:
    """(forward and loss, backward, Adam's step) peak bytes above the start, one triple per
    probe batch, of ``model`` training as ``train_one_epoch`` orders a step."""
    cfg, cuda = model.config, device.type == "cuda"
    generator = torch.Generator(device=device).manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters())
    live = LiveTensorBytes(device.type)
    start = torch.cuda.memory_allocated(device) if cuda else 0

    def lap() -> int:
        """The peak since the last lap; the next lap starts now."""
        if not cuda:
            peak = live.peak
            live.reset()
            return peak
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - start
        torch.cuda.reset_peak_memory_stats(device)
        return peak

    peaks = []
    with contextlib.nullcontext() if cuda else live:
        for b in probe_steps(cuda):
            x = torch.rand(b, cfg.in_channels, cfg.image_size, cfg.image_size,
                           device=device, generator=generator)  # (b, C, H, W)
            y = torch.randint(0, cfg.num_classes, (b,), device=device, generator=generator)
            lap()
            loss = model_loss(model(x, y), x, y)
            forward = lap()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            del loss
            backward = lap()
            optimizer.step()
            peaks.append((forward, backward, lap()))
    return [peaks[1], peaks[-1]]


def measure_training_memory(model: nn.Module, batch_size: int, resident: int = 0
                            ) -> MemoryEstimate:
    """The peak of a training step of ``model`` at ``batch_size`` (module docstring),
    measured on a copy: the model, its gradients, BatchNorm statistics and the random state
    are left as they were."""
    device = next(model.parameters()).device
    probe = copy.deepcopy(model).train()
    probe.zero_grad(set_to_none=True)
    cuda_rng = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda_rng):
        small_peaks, large_peaks = step_phase_peaks(probe, device)
    del probe
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    weights_and_adam = weights + ADAM_MOMENTS * sum(
        p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    small, large = PROBE_BATCHES
    phases = []
    for at_small, at_large in zip(small_peaks, large_peaks, strict=True):
        per_image = max(0, (at_large - at_small) // (large - small))
        phases.append((weights + max(0, at_small - small * per_image), per_image))
    return MemoryEstimate(batch_size, tuple(phases), weights_and_adam, resident)


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
