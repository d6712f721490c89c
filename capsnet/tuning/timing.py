"""How candidates are timed against each other: in turns, per device type a schedule.

On a GPU, kernels run asynchronously: a sample is several calls between two CUDA events
(one synchronisation per sample, not per call), after warm-up calls that let cuDNN's
autotuner settle, and ten or more samples per candidate. On a CPU a call takes long and its
time is what it is: after one warm-up call and one timed round, candidates clearly slower
than the best (:func:`contenders`) are timed no more, and further rounds stop at a time
budget. Everything that decides here takes plain values, so the GPU schedule is tested on a
CPU.
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
    ``cold_drop_ratio``: a candidate whose first (warm-up) call already took this many times
    a rival precision's best is dropped untimed (None: never); a first call is the slowest
    one, so the margin is wider than ``drop_ratio``."""

    warmup: int
    repeats: int
    min_repeats: int = 1
    inner: int = 1
    drop_ratio: float | None = None
    rows: int | None = None
    context_batch: int | None = None
    budget_s: float | None = None
    cold_drop_ratio: float | None = None


# A CPU call of PrimaryCaps at batch 128 takes 0.3-3 s: few, long calls. Its convolution
# is timed at the real batch (the GEMM path's fixed costs make small batches misleading);
# smaller layers get enough images for 8192 output positions, whole steps 32 images.
CPU_SCHEDULE = TimingSchedule(warmup=1, repeats=3, min_repeats=1, inner=1, drop_ratio=1.25,
                              rows=8192, context_batch=32, budget_s=10.0, cold_drop_ratio=1.5)
# A GPU call takes milliseconds: enough of them for CUDA events to resolve, cuDNN's
# autotuner (cudnn.benchmark) done in the warm-up, and the real batch (a GPU's efficiency
# depends on it).
GPU_SCHEDULE = TimingSchedule(warmup=3, repeats=10, min_repeats=10, inner=5)


def timing_schedule(device_type: str) -> TimingSchedule:
    """The schedule for a device type: CUDA GPUs and everything else (CPUs, MPS)."""
    return GPU_SCHEDULE if device_type == "cuda" else CPU_SCHEDULE


def contenders(seconds: Sequence[float], ratio: float | None,
               bar: float = float("inf")) -> list[int]:
    """Indices of the candidates still worth timing: within ``ratio`` of the fastest of
    ``seconds`` and of ``bar`` (the best time a rival of another precision reached)."""
    if ratio is None:
        return list(range(len(seconds)))
    best = min(min(seconds), bar)
    return [i for i, s in enumerate(seconds) if s <= ratio * best]


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
    :func:`contenders` keep the median of the rounds they ran (one whose warm-up call took
    ``cold_drop_ratio`` x ``bar`` keeps that call's time); rounds stop early when one
    contender is left or at ``deadline`` (``time.perf_counter()`` seconds)."""
    device_type = getattr(device, "type", str(device))
    schedule = schedule or timing_schedule(device_type)
    clock = clock or clock_for(device_type)
    times: list[list[float]] = [[] for _ in fns]
    alive = _warm_up(fns, device, schedule, bar, clock, times)
    for done in range(1, schedule.repeats + 1):
        if not alive:
            break
        for i in alive:
            times[i].append(clock(fns[i], device, schedule.inner))
        if done < schedule.min_repeats:
            continue
        medians = [statistics.median(times[i]) for i in alive]
        alive = [alive[k] for k in contenders(medians, schedule.drop_ratio, bar)]
        if len(alive) <= 1 or (deadline is not None and time.perf_counter() >= deadline):
            break
    return [statistics.median(t) for t in times]


def _warm_up(fns, device, schedule: TimingSchedule, bar: float, clock,
             times: list[list[float]]) -> list[int]:
    """Warm-up calls of every function; the first is timed when a rival's ``bar`` could
    drop it (its time then stands for the candidate). Returns the indices still in the race."""
    alive = []
    for i, fn in enumerate(fns):
        cold_ratio = schedule.cold_drop_ratio
        if schedule.warmup and cold_ratio is not None and bar < float("inf"):
            first = clock(fn, device, 1)
            if first > cold_ratio * bar:
                times[i].append(first)
                continue
            rest = schedule.warmup - 1
        else:
            rest = schedule.warmup
        for _ in range(rest):
            fn()
        alive.append(i)
    return alive
