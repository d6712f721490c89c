"""The default measurement of :func:`capsnet.tuning.choose_plan`: each convolution of a model
timed alone on inputs of its real shape, dtype and layout, and whole steps of the model.

Timing follows the device's :class:`~capsnet.tuning.timing.TimingSchedule`. The timer
remembers each layer's best time across precisions, so that the implementations of a
precision that cannot win (say float32, once bf16 ran the same layer twice as fast) are
timed once on a quarter of the images beside that best and dropped, and it stops extra
rounds at the schedule's time budget (the whole-step check still runs, one round past the
budget: it guards the cheaper layers' choices, whose calls are short and noisy).
"""
from __future__ import annotations

import copy
import math
import time

import torch
from torch import nn

from capsnet.layers.gemm_conv import GemmConv2d
from capsnet.losses import model_loss
from capsnet.models.precision import PRECISIONS, autocast_to
from capsnet.tuning.timing import (
    TimingSchedule,
    clock_for,
    interleaved_medians,
    past,
    timing_schedule,
)


def conv_layers(model: nn.Module) -> list[tuple[str, GemmConv2d]]:
    """The model's tunable convolutions, in the order the forward pass runs them."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, GemmConv2d)]


class ConvTimer:
    """Times one convolution layer of ``model`` on inputs of its real shape and dtype, in the
    layout the layer before it produces, forward and backward ('train') or forward only
    ('infer'), candidates timed in turns; :meth:`in_context` times whole steps."""

    def __init__(self, model: nn.Module, device: torch.device, batch: int, mode: str,
                 schedule: TimingSchedule | None = None):
        self.model, self.device, self.batch, self.mode = model, device, batch, mode
        self.schedule = schedule or timing_schedule(device.type)
        self.layers = dict(conv_layers(model))
        self.input_shapes = _input_shapes(model, device, list(self.layers))
        self.best: dict[str, tuple[float, str, str]] = {}  # layer -> fastest (s, precision, impl)
        self._clock = clock_for(device.type)
        budget = self.schedule.budget_s
        self.deadline = None if budget is None else time.perf_counter() + budget

    def __call__(self, name: str, impls: tuple[str, ...], precision: str) -> dict[str, float]:
        conv = self.layers[name]
        rival = self.best.get(name)  # (seconds, precision, impl): the fastest run so far
        seconds = self._screen(name, conv, impls, precision, rival) if rival else {}
        timed = [impl for impl in impls if impl not in seconds]
        if timed:
            x = self._input(name, conv, precision)
            fns = [self._run(_with_impl(conv, impl), x, precision) for impl in timed]
            bar = rival[0] if rival else math.inf
            seconds.update(zip(timed, self._medians(fns, bar), strict=True))
        fastest = min(timed or impls, key=seconds.get)
        if rival is None or seconds[fastest] < rival[0]:
            self.best[name] = (seconds[fastest], precision, fastest)
        return {impl: seconds[impl] for impl in impls}

    def _screen(self, name: str, conv: GemmConv2d, impls: tuple[str, ...], precision: str,
                rival: tuple[float, str, str]) -> dict[str, float]:
        """A layer a rival precision has timed already: every candidate runs once on a
        fraction of the images beside the rival's fastest; those clearly slower (past the
        schedule's drop ratio) are timed no more, their time scaled to the full batch."""
        batch, fraction = self._layer_batch(name), self.schedule.screen_fraction
        small = max(1, round(batch * (fraction or 1.0)))
        if fraction is None or small == batch:
            return {}
        seconds, rival_precision, rival_impl = rival
        runs = [(rival_impl, rival_precision), *((impl, precision) for impl in impls)]
        fns = [self._run(_with_impl(conv, impl), self._input(name, conv, p, small), p)
               for impl, p in runs]
        times = [self._clock(fn, self.device, 1) for fn in fns]
        scale = seconds / times[0]
        return {impl: scale * t for impl, t in zip(impls, times[1:], strict=True)
                if t > self.schedule.drop_ratio * times[0]}

    def in_context(self, name: str, impls: tuple[str, ...], precision: str,
                   choices: dict[str, str]) -> dict[str, float]:
        """Whole steps of the model (forward and backward of the loss, or forward alone)
        with layer ``name`` as each of ``impls`` and the others as ``choices``, in turns, at
        the largest of the layers' measurement batches (at most the schedule's
        ``context_batch``). The model is left as it was."""
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
                seconds = self._medians(fns)
            return dict(zip(impls, seconds, strict=True))
        finally:
            impls_before, model.compute_dtype, training = before
            for n, impl in impls_before.items():
                layers[n].set_impl(impl)
            model.train(training)
            model.zero_grad(set_to_none=True)

    def out_of_time(self) -> bool:
        """True once the schedule's time budget is spent (rounds are cut short since)."""
        return past(self.deadline)

    def _medians(self, fns, bar: float = math.inf) -> list[float]:
        return interleaved_medians(fns, self.device, self.schedule, bar=bar,
                                   deadline=self.deadline)

    def _batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Random images (b, C, H, W) and labels (b,), from a generator of their own."""
        cfg = self.model.config
        b = max(self._layer_batch(name) for name in self.layers)
        b = min(b, self.schedule.context_batch or b)
        generator = torch.Generator(device=self.device).manual_seed(0)
        x = torch.rand(b, cfg.in_channels, cfg.image_size, cfg.image_size,
                       device=self.device, generator=generator)
        y = torch.randint(0, cfg.num_classes, (b,), device=self.device, generator=generator)
        return x, y

    def _layer_batch(self, name: str) -> int:
        """Images enough for the schedule's output positions of a layer (at most the batch;
        the batch itself when the schedule names no rows)."""
        if self.schedule.rows is None:
            return self.batch
        C, H, W = self.input_shapes[name]
        out_positions = math.prod(_conv_output_size(self.layers[name], (H, W)))
        return max(1, min(self.batch, math.ceil(self.schedule.rows / out_positions)))

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

    def _input(self, name: str, conv: GemmConv2d, precision: str,
               batch: int | None = None) -> torch.Tensor:
        C, H, W = self.input_shapes[name]
        batch = batch or self._layer_batch(name)
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
