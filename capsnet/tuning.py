"""How a model computes on the machine at hand, by a rule, and how much memory its training
step takes, measured on the run's own first step.

The speed plan (nothing is timed): precision 'auto' is bf16 autocast where the device
computes bf16 natively (CPUs with AVX512-BF16 or AMX, CUDA GPUs from compute capability 8.0),
else float32; conv_impl 'auto' is the per-kernel-row GEMMs on a CPU
(:mod:`capsnet.layers.gemm_conv`), PyTorch's convolution (cuDNN) elsewhere.

The memory figure: read from the run itself (no probe of its own), after its first
training step (the peak so far and what stays between steps: their difference per image
gives the largest batch that fits a GPU) and after its first validation (the peak the log
line reports). The peak is CUDA's ``max_memory_allocated`` on a GPU and the process's
peak resident memory on a CPU.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from capsnet.devices import machine_description, native_bf16, tune_backends
from capsnet.layers.gemm_conv import CONV_IMPLS, GemmConv2d
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
# Of a GPU's memory, the share torch's caching allocator can use (fragmentation), and what
# the CUDA context and libraries take outside it.
GPU_USABLE_SHARE = 0.9
GPU_CONTEXT_BYTES = 512 * 2**20
PROC_STATM = Path("/proc/self/statm")


class MemoryExceeded(RuntimeError):
    """A run that ran out of device memory, said in one line with the measured step."""


def resident_bytes() -> tuple[int, int] | None:
    """(now, peak) bytes of this process's resident memory; None where the system does not
    say (Linux: /proc/self/statm and getrusage's ru_maxrss, in KiB)."""
    try:
        import resource

        pages = int(PROC_STATM.read_text().split()[1])
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (ImportError, OSError, ValueError, IndexError):
        return None
    now = pages * os.sysconf("SC_PAGE_SIZE")
    return now, max(now, peak_kib * 1024)  # the kernel updates the peak lazily


def memory_now(device: torch.device) -> tuple[int, int] | None:
    """(held now, peak so far) bytes: a GPU's allocated and max allocated memory; on a CPU
    the process's resident memory, the data and the libraries included; None elsewhere."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)
    return resident_bytes() if device.type == "cpu" else None


def measure_step_memory(device: torch.device, batch_size: int) -> dict:
    """Memory after the run's first training step at ``batch_size`` per process, read once:
    ``step_peak`` (the peak so far) and ``held`` (what stays between steps: the data, the
    weights, their gradients and Adam's moments, the EMA); {} where the device does not say.
    :func:`memory_line` adds the peak after the first validation, ``peak``."""
    now = memory_now(device)
    if now is None:
        return {}
    return {"held": now[0], "step_peak": now[1], "peak": now[1], "batch": batch_size,
            "device": device.type}


def per_image_bytes(memory: dict) -> int:
    """What the first step took per image beyond what stays between steps (0 on a CPU,
    whose freed memory stays resident)."""
    return max(0, memory["step_peak"] - memory["held"]) // max(1, memory["batch"])


def memory_line(memory: dict, epoch: int) -> str:
    """One line for the run log, after ``epoch``'s training and validation."""
    if not memory:
        return "not measured on this device"
    what = "the GPU's allocated" if memory["device"] == "cuda" else "the process's resident"
    return (f"{memory['peak'] / GIB:.2f} GiB peak per process by the end of epoch {epoch} "
            f"({what} memory; training at batch {memory['batch']} and validation; "
            f"{memory['step_peak'] / GIB:.2f} GiB by the end of the first step, "
            f"{memory['held'] / GIB:.2f} GiB held between steps)")


def device_memory(device: torch.device) -> int | None:
    """A GPU's memory in bytes; None for other devices."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory


def usable_gpu_bytes(total: int) -> int:
    """Of a GPU's ``total`` bytes, what a run's tensors can count on."""
    return max(0, int(GPU_USABLE_SHARE * total) - GPU_CONTEXT_BYTES)


def largest_batch(memory: dict, capacity: int) -> int:
    """The largest batch per process whose step fits in ``capacity`` bytes (0 if none)."""
    return max(0, (capacity - memory["held"]) // max(1, per_image_bytes(memory)))


def out_of_memory_message(device: torch.device, batch_size: int, memory: dict,
                          processes: int = 1) -> str:
    """The one line a run that ran out of device memory ends with: the first step's
    measure and the largest batch estimated to fit, or, before any step was measured,
    what to try."""
    if not memory:
        return (f"{device} ran out of memory before the first training step at batch "
                f"{batch_size} per process finished: use a smaller --batch-size or preset, "
                f"or --precision bf16 (or fp16)")
    total = device_memory(device)
    fits = largest_batch(memory, usable_gpu_bytes(total)) * processes if total else 0
    capacity = f" of the GPU's {total / GIB:.1f} GiB" if total else ""
    advice = (f"the largest batch estimated to fit is about {fits} (--batch-size {fits})"
              if fits else "not even one image fits: use a smaller preset, --precision bf16 "
              "(or fp16), or a larger GPU")
    return (f"{device} ran out of memory at batch {batch_size} per process: the first step "
            f"measured {memory['step_peak'] / GIB:.2f} GiB{capacity} (the estimate); "
            f"{advice}. The checkpoints of the epochs before are intact")
