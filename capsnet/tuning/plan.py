"""Kernels and precision chosen by measurement, as cuDNN's benchmark mode chooses algorithms.

For a model, a device and a batch size, :func:`choose_plan` times every implementation
of each convolution (``GemmConv2d.candidates``: the per-kernel-row GEMMs, oneDNN/cuDNN on
NCHW tensors, on channels-last tensors), forward and backward for training or forward
alone for inference, in float32 and in the 16-bit precision the device computes natively
(bf16; fp16 on GPUs without bf16), that one first. Each layer keeps its fastest
implementation; a 16-bit precision is chosen only when its convolutions, which hold almost
all of the arithmetic, are measurably faster than float32's. How candidates are timed
(warm-up, rounds, CUDA events, candidates dropped once clearly slower, a time budget on
CPUs) is :mod:`capsnet.tuning.timing`; the default measurement is
:class:`~capsnet.tuning.conv_timer.ConvTimer`. The choice is cached per machine
(:mod:`capsnet.tuning.cache`), so later runs start at once.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from capsnet.config import config_to_dict
from capsnet.layers.gemm_conv import CONV_IMPLS, GemmConv2d
from capsnet.models.precision import PRECISIONS, precision_name
from capsnet.tuning import cache
from capsnet.tuning.conv_timer import ConvTimer, conv_layers
from capsnet.tuning.hardware import low_precisions, machine_description

PLAN_FORMAT = 4  # bump when the measurement changes: older cache entries are measured again
AUTO = "auto"
MODES = ("train", "infer")
# Inference is tuned at one batch size, so that every batch (one image or a thousand) runs
# the same kernels and gives the same per-image results.
INFERENCE_BATCH = 64
# A 16-bit precision is chosen only when its convolutions take at most this share of
# float32's time.
LOW_PRECISION_MAX_TIME_RATIO = 0.9

# measure(conv name, implementations, precision) -> {implementation: seconds}
Measure = Callable[[str, tuple[str, ...], str], dict[str, float]]


@dataclass
class SpeedPlan:
    """How a model runs on a machine: its precision, each convolution's implementation, the
    timings that chose them (precision -> layer -> implementation -> seconds) and where the
    choice came from ('measured', 'cache', 'given' when nothing was left to choose, or
    'checkpoint' for a resumed run)."""

    precision: str
    conv_impls: dict[str, str]
    timings: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    # whole-step seconds of the chosen precision's cheaper layers' candidates, the other
    # layers fixed (layer -> implementation -> seconds): the choice in context
    context_timings: dict[str, dict[str, float]] = field(default_factory=dict)
    measure_seconds: float = 0.0
    source: str = "given"
    machine: dict = field(default_factory=dict)
    budget_spent: bool = False  # measuring reached its time budget: fewer rounds

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> SpeedPlan:
        return cls(**{k: values[k] for k in cls.__dataclass_fields__ if k in values})

    def describe(self) -> str:
        """One line for the run log."""
        convs = ", ".join(f"{name} {impl}" for name, impl in self.conv_impls.items())
        spent = "; time budget reached: fewer rounds" if self.budget_spent else ""
        how = {"measured": f"measured in {self.measure_seconds:.1f} s{spent}",
               "cache": "from the cache of earlier measurements",
               "checkpoint": "kept from the resumed run",
               "given": "as given"}[self.source]
        line = f"precision {self.precision}; convolutions: {convs or 'none'} ({how})"
        for name, times in self.context_timings.items():
            line += f"; {name} in whole steps: " + ", ".join(
                f"{impl} {1000 * s:.0f} ms" for impl, s in times.items())
        totals = self.precision_totals()
        if len(totals) > 1:
            line += "; fastest convolutions per step: " + ", ".join(
                f"{p} {1000 * s:.0f} ms" for p, s in totals.items())
        return line

    def precision_totals(self) -> dict[str, float]:
        """Seconds of the fastest implementation of every layer, summed, per precision."""
        return {p: sum(min(times.values()) for times in layers.values())
                for p, layers in self.timings.items()}


def apply_plan(model: nn.Module, plan: SpeedPlan) -> None:
    """Make ``model`` run as ``plan`` says: its precision and its layers' implementations."""
    for name, conv in conv_layers(model):
        if name in plan.conv_impls:
            conv.set_impl(plan.conv_impls[name])
    model.compute_dtype = PRECISIONS[plan.precision]


def current_plan(model: nn.Module) -> SpeedPlan:
    """The plan a model runs with now (nothing measured)."""
    return SpeedPlan(precision_name(getattr(model, "compute_dtype", None)),
                     {name: conv.impl for name, conv in conv_layers(model)})


def choose_plan(model: nn.Module, device: torch.device, batch_size: int, *,
                mode: str = "train", precision: str = AUTO, conv_impl: str = AUTO,
                measure: Measure | None = None, use_cache: bool = True) -> SpeedPlan:
    """The fastest way to run ``model`` on ``device`` at ``batch_size`` ('train': forward
    and backward; 'infer': forward only, measured at INFERENCE_BATCH whatever the batch).

    ``precision`` ('auto', 'fp32', 'bf16', 'fp16') and ``conv_impl`` ('auto' or one of CONV_IMPLS)
    force a choice when not 'auto'. ``measure`` replaces the timing (tests inject timings).
    The model is left as it was; :func:`apply_plan` applies the result."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
    precisions = _precision_candidates(precision, device)
    layers = conv_layers(model)
    options = {name: _impl_candidates(conv, conv_impl, device) for name, conv in layers}
    machine = machine_description(device)
    if len(precisions) == 1 and all(len(o) == 1 for o in options.values()):
        return SpeedPlan(precisions[0], {name: o[0] for name, o in options.items()},
                         machine=machine)
    batch = INFERENCE_BATCH if mode == "infer" else batch_size
    key = cache.cache_key({"format": PLAN_FORMAT, "machine": machine, "mode": mode,
                           "batch": batch, "model": type(model).__name__,
                           "config": config_to_dict(model.config), "precision": precision,
                           "conv_impl": conv_impl})
    expected = {"format": PLAN_FORMAT, "precisions": precisions, "options": options}
    entry = cache.read_entry(key) if use_cache else None
    if entry is not None and all(entry.get(k) == v for k, v in expected.items()):
        return SpeedPlan.from_dict({**entry["plan"], "source": "cache"})
    plan = _measure_plan(model, layers, options, precisions, machine,
                         measure or ConvTimer(model, device, batch, mode))
    if use_cache:
        cache.write_entry(key, {**expected, "plan": plan.as_dict()})
    return plan


def tune_for_inference(model: nn.Module, device: torch.device, precision: str = AUTO,
                       conv_impl: str = AUTO) -> SpeedPlan:
    """Choose (or read from the cache) and apply the inference plan of ``model``: forward
    passes only, measured at INFERENCE_BATCH so that every batch size runs the same kernels."""
    plan = choose_plan(model, device, INFERENCE_BATCH, mode="infer", precision=precision,
                       conv_impl=conv_impl)
    apply_plan(model, plan)
    return plan


def _precision_candidates(precision: str, device: torch.device) -> list[str]:
    """float32 first (the plan when nothing is faster), then the native 16-bit precision."""
    if precision == AUTO:
        return ["fp32", *low_precisions(device)]
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose from auto, "
                         f"{', '.join(PRECISIONS)}")
    return [precision]


def _impl_candidates(conv: GemmConv2d, conv_impl: str, device: torch.device) -> list[str]:
    available = list(conv.candidates(device))
    if conv_impl == AUTO:
        return available
    if conv_impl not in CONV_IMPLS:
        raise ValueError(f"unknown conv implementation {conv_impl!r}; choose from auto, "
                         f"{', '.join(CONV_IMPLS)}")
    # "gemm" on a GPU: PyTorch's convolution, in the layout "gemm" keeps its weights in
    return [conv_impl if conv_impl in available else "channels_last"]


def _measure_plan(model: nn.Module, layers, options: dict[str, list[str]],
                  precisions: list[str], machine: dict, measure: Measure) -> SpeedPlan:
    """Greedy, layer by layer in forward order (a layer's input layout is what the layer
    before it chose), for each precision, the 16-bit one first (the likely winner, so that
    float32's clearly slower candidates are dropped early); then the precision whose best
    is fastest; then, when ``measure`` can time whole steps, the cheaper layers again in
    context."""
    start = time.perf_counter()
    before = {name: conv.impl for name, conv in layers}
    timings: dict[str, dict[str, dict[str, float]]] = {}
    chosen: dict[str, dict[str, str]] = {}
    try:
        for p in reversed(precisions):
            timings[p], chosen[p] = {}, {}
            for name, conv in layers:
                timings[p][name] = measure(name, tuple(options[name]), p)
                chosen[p][name] = min(timings[p][name], key=timings[p][name].get)
                conv.set_impl(chosen[p][name])
        timings = {p: timings[p] for p in precisions}  # in the order of the candidates
        plan = SpeedPlan(precisions[0], chosen[precisions[0]], timings, source="measured",
                         machine=machine)
        plan.precision = faster_precision(plan.precision_totals(), precisions[0])
        plan.conv_impls = chosen[plan.precision]
        if hasattr(measure, "in_context"):
            _refine_in_context(plan, options, measure)
        plan.budget_spent = getattr(measure, "out_of_time", lambda: False)()
    finally:
        for name, conv in layers:
            conv.set_impl(before[name])
    plan.measure_seconds = time.perf_counter() - start
    return plan


def faster_precision(totals: dict[str, float], default: str = "fp32") -> str:
    """The precision to run: a 16-bit one whose convolutions take at most
    LOW_PRECISION_MAX_TIME_RATIO of float32's time (the fastest such), else ``default``."""
    reference = totals.get("fp32", math.inf)
    low = {p: s for p, s in totals.items()
           if p != "fp32" and s <= LOW_PRECISION_MAX_TIME_RATIO * reference}
    return min(low, key=low.get) if low else default


def _refine_in_context(plan: SpeedPlan, options: dict[str, list[str]], measure) -> None:
    """A layer's cost alone is not its cost in the model: its output layout and its
    gradient meet the next layer's. The layers other than the most expensive one (whose
    own time dominates), cheapest first, are chosen again by timing whole training steps
    (or forward passes) of the model with each candidate, the other layers as chosen."""
    best_alone = {name: min(times.values())
                  for name, times in plan.timings[plan.precision].items()}
    dominant = max(best_alone, key=best_alone.get)
    for name in sorted(best_alone, key=best_alone.get):
        if name == dominant or len(options[name]) < 2:
            continue
        times = measure.in_context(name, tuple(options[name]), plan.precision, plan.conv_impls)
        plan.context_timings[name] = times
        plan.conv_impls = {**plan.conv_impls, name: min(times, key=times.get)}
