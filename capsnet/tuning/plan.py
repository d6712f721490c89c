"""How a model computes on a device, by a rule (nothing is timed: the same machine and flags
always give the same plan):

- precision 'auto': bf16 autocast where the device computes bf16 natively (CPUs with
  AVX512-BF16 or AMX, CUDA GPUs of compute capability 8.0 on), else float32;
- conv_impl 'auto': the per-kernel-row GEMMs on a CPU (:mod:`capsnet.layers.gemm_conv`),
  PyTorch's convolution (cuDNN) elsewhere.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from capsnet.devices import machine_description, native_bf16
from capsnet.layers.gemm_conv import CONV_IMPLS, GemmConv2d
from capsnet.models.precision import PRECISIONS, precision_name

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
