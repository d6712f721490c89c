"""Kernels and precision chosen by measurement, as cuDNN's benchmark mode chooses algorithms.

For a model, a device and a batch size, :func:`choose_plan` times every implementation
of each convolution (``GemmConv2d.candidates``: the per-kernel-row GEMMs, oneDNN/cuDNN on
NCHW tensors, on channels-last tensors), forward and backward for training or forward
alone for inference, in float32 and, where the device computes bf16 natively, in bf16.
Each layer keeps its fastest implementation; bf16 is chosen only when its convolutions,
which hold almost all of the arithmetic, are measurably faster than float32's. The choice
is cached per machine (:mod:`capsnet.tuning.cache`), so later runs start at once.
"""
from __future__ import annotations

import copy
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from capsnet.config import config_to_dict
from capsnet.layers.gemm_conv import CONV_IMPLS, GemmConv2d
from capsnet.losses import model_loss
from capsnet.models.precision import PRECISIONS, autocast_to, precision_name
from capsnet.tuning import cache
from capsnet.tuning.hardware import machine_description, native_bf16

PLAN_FORMAT = 3  # bump when the measurement changes: older cache entries are measured again
AUTO = "auto"
MODES = ("train", "infer")
# Inference is tuned at one batch size, so that every batch (one image or a thousand) runs
# the same kernels and gives the same per-image results.
INFERENCE_BATCH = 64
# A timed convolution gets enough images for this many output positions (the rows of its
# matrix products), at most the real batch: kernels are as efficient from there on, and
# the measurement of a large CNN layer stays short.
MEASURE_ROWS = 8192
WARMUP, REPEATS = 1, 3
# bf16 is chosen only when its convolutions take at most this share of float32's time.
BF16_MAX_TIME_RATIO = 0.9

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

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> SpeedPlan:
        return cls(**{k: values[k] for k in cls.__dataclass_fields__ if k in values})

    def describe(self) -> str:
        """One line for the run log."""
        convs = ", ".join(f"{name} {impl}" for name, impl in self.conv_impls.items())
        how = {"measured": f"measured in {self.measure_seconds:.1f} s",
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


def conv_layers(model: nn.Module) -> list[tuple[str, GemmConv2d]]:
    """The model's tunable convolutions, in the order the forward pass runs them."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, GemmConv2d)]


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

    ``precision`` ('auto', 'fp32', 'bf16') and ``conv_impl`` ('auto' or one of CONV_IMPLS)
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
    if precision == AUTO:
        return ["fp32", "bf16"] if native_bf16(device) else ["fp32"]
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
    before it chose), for each precision; then the precision whose best is fastest; then,
    when ``measure`` can time whole steps, the cheaper layers again in context."""
    start = time.perf_counter()
    before = {name: conv.impl for name, conv in layers}
    timings: dict[str, dict[str, dict[str, float]]] = {}
    chosen: dict[str, dict[str, str]] = {}
    try:
        for p in precisions:
            timings[p], chosen[p] = {}, {}
            for name, conv in layers:
                timings[p][name] = measure(name, tuple(options[name]), p)
                chosen[p][name] = min(timings[p][name], key=timings[p][name].get)
                conv.set_impl(chosen[p][name])
        plan = SpeedPlan(precisions[0], chosen[precisions[0]], timings, source="measured",
                         machine=machine)
        totals = plan.precision_totals()
        if "bf16" in totals and totals["bf16"] <= BF16_MAX_TIME_RATIO * totals.get("fp32",
                                                                                    math.inf):
            plan.precision, plan.conv_impls = "bf16", chosen["bf16"]
        if hasattr(measure, "in_context"):
            _refine_in_context(plan, options, measure)
    finally:
        for name, conv in layers:
            conv.set_impl(before[name])
    plan.measure_seconds = time.perf_counter() - start
    return plan


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


class ConvTimer:
    """The default :data:`Measure`: times one convolution layer of ``model`` on inputs of
    its real shape and dtype, in the layout the layer before it produces, forward and
    backward ('train') or forward only ('infer'), candidates timed in turns."""

    def __init__(self, model: nn.Module, device: torch.device, batch: int, mode: str):
        self.model, self.device, self.batch, self.mode = model, device, batch, mode
        self.layers = dict(conv_layers(model))
        self.input_shapes = _input_shapes(model, device, list(self.layers))

    def __call__(self, name: str, impls: tuple[str, ...], precision: str) -> dict[str, float]:
        conv = self.layers[name]
        x = self._input(name, conv, precision)
        fns = [self._run(_with_impl(conv, impl), x, precision) for impl in impls]
        seconds = interleaved_medians(fns, self.device)
        return dict(zip(impls, seconds, strict=False))

    def in_context(self, name: str, impls: tuple[str, ...], precision: str,
                   choices: dict[str, str]) -> dict[str, float]:
        """Whole steps of the model (forward and backward of the loss, or forward alone)
        with layer ``name`` as each of ``impls`` and the others as ``choices``, in turns, at
        the largest of the layers' measurement batches (the real batch for CapsNet, whose
        PrimaryCaps grid is small; a few images for a CNN at full resolution). The model is
        left as it was."""
        model, layers = self.model, self.layers
        before = ({n: conv.impl for n, conv in layers.items()}, model.compute_dtype,
                  model.training)
        x, y = self._batch()
        cuda = [self.device] if self.device.type == "cuda" else []
        # fork_rng: dropout in these steps must not move the run's random state
        try:
            for n, impl in choices.items():
                layers[n].set_impl(impl)
            model.compute_dtype = PRECISIONS[precision]
            model.train(self.mode == "train")
            fns = [self._step(layers[name], impl, x, y) for impl in impls]
            with torch.random.fork_rng(devices=cuda):
                seconds = interleaved_medians(fns, self.device)
            return dict(zip(impls, seconds, strict=True))
        finally:
            impls_before, model.compute_dtype, training = before
            for n, impl in impls_before.items():
                layers[n].set_impl(impl)
            model.train(training)
            model.zero_grad(set_to_none=True)

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Random images (b, C, H, W) and labels (b,), from a generator of their own."""
        cfg = self.model.config
        b = max(self._layer_batch(name) for name in self.layers)
        generator = torch.Generator(device=self.device).manual_seed(0)
        x = torch.rand(b, cfg.in_channels, cfg.image_size, cfg.image_size,
                       device=self.device, generator=generator)
        y = torch.randint(0, cfg.num_classes, (b,), device=self.device, generator=generator)
        return x, y

    def _layer_batch(self, name: str) -> int:
        """Images enough for MEASURE_ROWS output positions of a layer, at most the batch."""
        C, H, W = self.input_shapes[name]
        out_positions = math.prod(_conv_output_size(self.layers[name], (H, W)))
        return max(1, min(self.batch, math.ceil(MEASURE_ROWS / out_positions)))

    def _step(self, conv: GemmConv2d, impl: str, x: torch.Tensor, y: torch.Tensor):
        def step():
            conv.set_impl(impl)
            if self.mode == "train":
                model_loss(self.model(x, y), x, y).backward()
                self.model.zero_grad(set_to_none=True)
            else:
                with torch.no_grad():
                    self.model(x)
        return step

    def _input(self, name: str, conv: GemmConv2d, precision: str) -> torch.Tensor:
        C, H, W = self.input_shapes[name]
        batch = self._layer_batch(name)
        names = list(self.layers)
        first = names.index(name) == 0
        # A generator of its own: measuring must not move the run's random state.
        generator = torch.Generator(device=self.device).manual_seed(0)
        x = torch.rand(batch, C, H, W, device=self.device, generator=generator)  # (b, C, H, W)
        if not first:  # a hidden layer: the previous convolution's dtype and layout
            previous = self.layers[names[names.index(name) - 1]]
            if PRECISIONS[precision] is not None:
                x = x.to(PRECISIONS[precision])
            if previous.impl != "native":
                x = x.contiguous(memory_format=torch.channels_last)
        return x.requires_grad_(self.mode == "train" and not first)

    def _run(self, conv: GemmConv2d, x: torch.Tensor, precision: str):
        def run():
            with torch.set_grad_enabled(self.mode == "train"), \
                    autocast_to(self.device, PRECISIONS[precision]):
                out = conv(x)
            if self.mode == "train":
                out.backward(torch.ones_like(out))
                conv.zero_grad(set_to_none=True)
                x.grad = None
        return run


def _with_impl(conv: GemmConv2d, impl: str) -> GemmConv2d:
    """A copy of ``conv`` running as ``impl`` (each candidate keeps its own weight layout)."""
    twin = copy.deepcopy(conv)
    twin.set_impl(impl)
    return twin


def _conv_output_size(conv: GemmConv2d, size: tuple[int, int]) -> tuple[int, int]:
    return tuple((s + 2 * p - k) // st + 1 for s, p, k, st
                 in zip(size, conv.padding, conv.kernel_size, conv.stride, strict=False))


@torch.no_grad()
def _input_shapes(model: nn.Module, device: torch.device, names: list[str]) -> dict:
    """(C, H, W) of each named layer's input, from one forward pass of one image."""
    shapes, hooks = {}, []
    modules = dict(model.named_modules())

    def record(name):
        def hook(module, args, out) -> None:
            shapes[name] = tuple(args[0].shape[1:])
        return hook

    for name in names:
        hooks.append(modules[name].register_forward_hook(record(name)))
    cfg = model.config
    was_training = model.training
    try:
        model.eval()
        model(torch.zeros(1, cfg.in_channels, cfg.image_size, cfg.image_size, device=device))
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    return shapes


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_medians(fns, device: torch.device, warmup: int = WARMUP,
                        repeats: int = REPEATS) -> list[float]:
    """Median seconds of each function, timed in turns (a, b, c, a, b, c, ...) so that a
    host whose speed drifts shifts them all alike."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, seconds in zip(fns, times, strict=False):
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            seconds.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]
