"""How candidates are timed against each other: in turns, per device type a schedule.

On a GPU, kernels run asynchronously: a sample is several calls between two CUDA events
(one synchronisation per sample, not per call), after warm-up calls of every candidate that
let cuDNN's autotuner settle, and ten or more samples per candidate. On a CPU a call takes
long and its time is what it is: one warm-up call grows the heap (the first call in a
process pays its page faults; a candidate's own first call costs no more than its later
ones), then each candidate is timed once, and only those within reach of the best
(:func:`contenders`) are timed again, until they tie, three rounds, or a time budget.
Everything that decides here takes plain values, so the GPU schedule is tested on a CPU.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TimingSchedule:
    """warmup calls, then up to ``repeats`` timed rounds of ``inner`` calls each; after
    ``min_repeats`` rounds a candidate slower than ``drop_ratio`` x the best is dropped
    (None: never). ``rows``: output positions a convolution is timed on (None: the real
    batch); ``context_batch``: the batch of whole training steps (None: the real batch);
    ``budget_s``: seconds after which no further rounds start (None: no limit).
    ``warm_all``: warm-up calls for every candidate (GPU: each has kernels to autotune), or
    for the first only, when the layer is timed first (CPU: the heap grows once).
    ``tie_ratio``: rounds stop once every contender is within this factor of the best (a
    tie: any of them runs as fast; None: never). ``screen_fraction``: a layer's candidates
    in a second precision first run once on this share of the images beside the rival
    precision's best, and only those within ``drop_ratio`` of it at that size are timed
    (None: no screening)."""

    warmup: int
    repeats: int
    min_repeats: int = 1
    inner: int = 1
    drop_ratio: float | None = None
    rows: int | None = None
    context_batch: int | None = None
    budget_s: float | None = None
    warm_all: bool = True
    tie_ratio: float | None = None
    screen_fraction: float | None = None


# A CPU call of PrimaryCaps at batch 128 takes 0.3-3 s: few, long calls. Its convolution
# is timed at the real batch (the GEMM path's fixed costs make small batches misleading);
# smaller layers get enough images for 8192 output positions, whole steps 32 images.
CPU_SCHEDULE = TimingSchedule(warmup=1, repeats=3, min_repeats=1, inner=1, drop_ratio=1.25,
                              rows=8192, context_batch=32, budget_s=10.0, warm_all=False,
                              tie_ratio=1.05, screen_fraction=0.25)
# A GPU call takes milliseconds: enough of them for CUDA events to resolve, cuDNN's
# autotuner (cudnn.benchmark) done in the warm-up, and the real batch (a GPU's efficiency
# depends on it).
GPU_SCHEDULE = TimingSchedule(warmup=3, repeats=10, min_repeats=10, inner=5)


def timing_schedule(device_type: str) -> TimingSchedule:
    """The schedule for a device type: CUDA GPUs and everything else (CPUs, MPS)."""
    return GPU_SCHEDULE if device_type == "cuda" else CPU_SCHEDULE


def contenders(seconds: Sequence[float], ratio: float | None,
               bar: float = float("inf"), tie: float | None = None) -> list[int]:
    """Indices of the candidates still worth timing: within ``ratio`` of the fastest of
    ``seconds`` and of ``bar`` (the best time a rival of another precision reached); only
    the fastest when they are all within ``tie`` of it (more rounds would not pay)."""
    if ratio is None:
        return list(range(len(seconds)))
    best = min(min(seconds), bar)
    alive = [i for i, s in enumerate(seconds) if s <= ratio * best]
    if tie is not None and len(alive) > 1 and all(seconds[i] <= tie * best for i in alive):
        return [min(alive, key=lambda i: seconds[i])]
    return alive


def synchronize(device) -> None:
    """Wait for the device's queued work (a no-op on a CPU)."""
    if getattr(device, "type", device) == "cuda":
        import torch

        torch.cuda.synchronize(device)


def wall_clock(fn: Callable[[], object], device, inner: int) -> float:
    """Seconds per call of ``fn`` over ``inner`` calls, by the host clock."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / inner


def cuda_event_clock(fn: Callable[[], object], device, inner: int) -> float:
    """Seconds per call of ``fn`` over ``inner`` calls between two CUDA events on the
    device's current stream: the GPU's own time, one synchronisation per sample."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.device(device):
        start.record()
        for _ in range(inner):
            fn()
        end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0 / inner


def clock_for(device_type: str) -> Callable:
    return cuda_event_clock if device_type == "cuda" else wall_clock


def interleaved_medians(fns: Sequence[Callable[[], object]], device,
                        schedule: TimingSchedule | None = None, bar: float = float("inf"),
                        deadline: float | None = None, clock: Callable | None = None
                        ) -> list[float]:
    """Median seconds of each function, timed in turns (a, b, c, a, b, c, ...) so that a
    host whose speed drifts shifts them all alike. Candidates that fall out of
    :func:`contenders` (``bar``: the best a rival precision reached) keep the median of the
    rounds they ran; rounds stop early when one contender is left or at ``deadline``
    (``time.perf_counter()`` seconds)."""
    device_type = getattr(device, "type", str(device))
    schedule = schedule or timing_schedule(device_type)
    clock = clock or clock_for(device_type)
    for fn in warm_up_calls(fns, schedule, bar):
        for _ in range(schedule.warmup):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    alive = list(range(len(fns)))
    for done in range(1, schedule.repeats + 1):
        for i in alive:
            times[i].append(clock(fns[i], device, schedule.inner))
        if done < schedule.min_repeats:
            continue
        medians = [statistics.median(times[i]) for i in alive]
        alive = [alive[k] for k in contenders(medians, schedule.drop_ratio, bar,
                                              schedule.tie_ratio)]
        if len(alive) <= 1 or past(deadline):
            break
    return [statistics.median(t) for t in times]


def warm_up_calls(fns: Sequence[Callable], schedule: TimingSchedule, bar: float) -> list:
    """The functions to warm up: all (``warm_all``), else the first, and none when a rival
    precision has run the same layer already (``bar``: the heap has grown for it)."""
    if schedule.warm_all:
        return list(fns)
    return list(fns[:1]) if bar == float("inf") else []


def past(deadline: float | None) -> bool:
    """True once ``deadline`` (``time.perf_counter()`` seconds) has come."""
    return deadline is not None and time.perf_counter() >= deadline
