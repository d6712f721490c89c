"""Learning-rate schedules.

``exp`` without warm-up is ExponentialLR with a floor ``min_lr``, stepped once per epoch.
Every other schedule is a LambdaLR stepped before each optimiser step, its multiplier a
:class:`StepSchedule` (an object, so the state_dict carries it and a resume continues it
bit-exactly; :func:`replan_length` re-plans it to a resumed run's new --epochs).
Multipliers at step s (W warm-up steps, T in the run, f = min_lr / lr):

- ``cosine``: (s + 1) / W while s < W, then f + (1 - f) (1 + cos(pi (s - W) / (T - W))) / 2;
- ``onecycle``: a half-cosine from 1/25 up to 1 over W steps, then down to f (OneCycleLR);
- ``exp`` with warm-up: (s + 1) / W while s < W, times max(f, lr_decay ** epoch)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.optim.lr_scheduler import ExponentialLR, LambdaLR, LRScheduler

ONECYCLE_START = 1 / 25  # one-cycle starts at the peak / 25 (OneCycleLR's div_factor)


def linear_warmup(step: int, warmup_steps: int) -> float:
    """(step + 1) / warmup_steps during the warm-up, 1 after it (and without one)."""
    return 1.0 if step >= warmup_steps else (step + 1) / warmup_steps


def half_cosine(start: float, end: float, progress: float) -> float:
    """From ``start`` (progress 0) to ``end`` (progress 1) along half a cosine."""
    return end + (start - end) * (1.0 + math.cos(math.pi * progress)) / 2.0


def anneal_progress(step: int, warmup_steps: int, total_steps: int) -> float:
    """How far into the annealing after the warm-up ``step`` is, in [0, 1]."""
    return min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, floor: float) -> float:
    """Linear warm-up to 1, then a cosine down to ``floor`` at ``total_steps``."""
    if step < warmup_steps:
        return linear_warmup(step, warmup_steps)
    return half_cosine(1.0, floor, anneal_progress(step, warmup_steps, total_steps))


def one_cycle(step: int, warmup_steps: int, total_steps: int, floor: float,
              start: float = ONECYCLE_START) -> float:
    """Half-cosine from ``start`` up to 1 over the warm-up, then half-cosine to ``floor``."""
    if step < warmup_steps:
        return half_cosine(start, 1.0, step / warmup_steps)
    return half_cosine(1.0, floor, anneal_progress(step, warmup_steps, total_steps))


def exp_staircase(step: int, warmup_steps: int, steps_per_epoch: int, decay: float,
                  floor: float = 0.0) -> float:
    """The paper's decay per epoch down to ``floor``, after a linear warm-up."""
    return linear_warmup(step, warmup_steps) * max(floor, decay ** (step // steps_per_epoch))


class FlooredExponentialLR(ExponentialLR):
    """ExponentialLR never below ``min_lr`` (with 0, ExponentialLR to the bit)."""

    def __init__(self, optimizer: torch.optim.Optimizer, gamma: float, min_lr: float = 0.0,
                 last_epoch: int = -1) -> None:
        self.min_lr = min_lr
        super().__init__(optimizer, gamma, last_epoch)

    def get_lr(self) -> list[float]:
        return [max(self.min_lr, lr) for lr in super().get_lr()]

    def _get_closed_form_lr(self) -> list[float]:
        return [max(self.min_lr, lr) for lr in super()._get_closed_form_lr()]


@dataclass
class StepSchedule:
    """The multiplier of the peak rate at each optimiser step (LambdaLR's ``lr_lambda``)."""

    shape: str  # 'cosine', 'onecycle' or 'exp'
    warmup_steps: int
    total_steps: int
    floor: float  # min_lr / peak lr
    steps_per_epoch: int
    decay: float  # 'exp': factor per epoch

    def __call__(self, step: int) -> float:
        if self.shape == "cosine":
            return warmup_cosine(step, self.warmup_steps, self.total_steps, self.floor)
        if self.shape == "onecycle":
            return one_cycle(step, self.warmup_steps, self.total_steps, self.floor)
        if self.shape == "exp":
            return exp_staircase(step, self.warmup_steps, self.steps_per_epoch, self.decay,
                                 self.floor)
        raise ValueError(f"unknown schedule shape {self.shape!r}")


def is_per_step(settings) -> bool:
    """Whether the settings' schedule is set every optimiser step (all but the paper's)."""
    return settings.schedule != "exp" or settings.warmup_epochs > 0


def make_scheduler(optimizer: torch.optim.Optimizer, settings,
                   steps_per_epoch: int) -> tuple[LRScheduler, bool]:
    """The run's scheduler over ``optimizer`` and whether it steps per optimiser step (True)
    or per epoch (False)."""
    if not is_per_step(settings):
        return FlooredExponentialLR(optimizer, settings.lr_decay, settings.min_lr), False
    steps_per_epoch = max(1, steps_per_epoch)
    schedule = StepSchedule(settings.schedule,
                            warmup_steps=round(settings.warmup_epochs * steps_per_epoch),
                            total_steps=settings.epochs * steps_per_epoch,
                            floor=settings.min_lr / settings.lr,
                            steps_per_epoch=steps_per_epoch, decay=settings.lr_decay)
    return LambdaLR(optimizer, schedule), True


def step_schedule(scheduler: LRScheduler) -> StepSchedule | None:
    """The per-step multiplier of a scheduler built here; None for the per-epoch exp."""
    lambdas = getattr(scheduler, "lr_lambdas", None)
    return lambdas[0] if lambdas and isinstance(lambdas[0], StepSchedule) else None


def replan_length(scheduler: LRScheduler, total_steps: int) -> str | None:
    """Make a restored per-step schedule end at ``total_steps`` and set the next step's rate
    from it; returns the change for the log (None when unchanged or for ``exp``)."""
    schedule = step_schedule(scheduler)
    if schedule is None or schedule.total_steps == total_steps:
        return None
    planned_epochs = schedule.total_steps // schedule.steps_per_epoch
    schedule.total_steps = total_steps
    step = scheduler.last_epoch  # the 0-based index of the next optimiser step
    for group, base in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, strict=True):
        group["lr"] = base * schedule(step)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
    if schedule.shape == "exp":
        return None
    return (f"learning rate: the {schedule.shape} schedule planned to end after epoch "
            f"{planned_epochs} now ends after epoch {total_steps // schedule.steps_per_epoch}; "
            f"the next step's rate is {scheduler._last_lr[0]:.3g}")
