"""What a run trains and how: the model, Adam, the learning-rate schedule and the moving
average of the weights, and their part of a checkpoint. With an average, it is the run's
model (validated, saved as ``state_dict``, tested); the trained weights are ``raw_state_dict``."""
from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from capsnet.checkpoint import CheckpointError
from capsnet.models import build_model, entry_of, has_option, make_config, unwrap
from capsnet.models.sizing import check_fits
from capsnet.training.settings import TrainSettings


def half_cosine(start: float, end: float, progress: float) -> float:
    """From ``start`` (progress 0) to ``end`` (progress 1) along half a cosine."""
    return end + (start - end) * (1.0 + math.cos(math.pi * progress)) / 2.0


@dataclass
class Schedule:
    """The multiplier of the peak rate at optimiser step s, LambdaLR's ``lr_lambda`` (an
    object, so that the scheduler's state_dict carries it and a resume continues it). With
    W warm-up steps, T steps in the run and f = min_lr / lr:

    - ``exp`` (the paper's): (s + 1) / W while s < W, times max(f, decay ** epoch);
    - ``cosine``: (s + 1) / W while s < W, then half a cosine from 1 down to f at T.
    """

    shape: str
    warmup_steps: int
    total_steps: int
    floor: float
    steps_per_epoch: int
    decay: float  # 'exp': the factor per epoch
    decay_start: int = 0  # 'exp': the epoch from which ``decay`` applies (a resume may change it)
    decayed: float = 1.0  # 'exp': the factor reached by then

    def __call__(self, step: int) -> float:
        warming = step < self.warmup_steps
        warmup = (step + 1) / self.warmup_steps if warming else 1.0
        if self.shape == "exp":
            epochs = step // self.steps_per_epoch - self.decay_start
            return warmup * max(self.floor, self.decayed * self.decay ** epochs)
        if warming:
            return warmup
        annealed = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        return half_cosine(1.0, self.floor, min(1.0, annealed))


def make_scheduler(optimizer: torch.optim.Optimizer, settings: TrainSettings,
                   steps_per_epoch: int) -> LambdaLR:
    """The run's schedule, stepped after every optimiser step."""
    steps_per_epoch = max(1, steps_per_epoch)
    return LambdaLR(optimizer, Schedule(
        settings.schedule, warmup_steps=round(settings.warmup_epochs * steps_per_epoch),
        total_steps=settings.epochs * steps_per_epoch, floor=settings.min_lr / settings.lr,
        steps_per_epoch=steps_per_epoch, decay=settings.lr_decay))


def replan(scheduler: LambdaLR, total_steps: int, decay: float) -> str | None:
    """Make a restored schedule end at ``total_steps`` and, for 'exp', decay by ``decay`` from
    the next epoch on; sets the next step's rate. Returns a change of length for the log."""
    schedule, step = scheduler.lr_lambdas[0], scheduler.last_epoch  # the next step's index
    planned_epochs = schedule.total_steps // schedule.steps_per_epoch
    changed_length = schedule.total_steps != total_steps and schedule.shape != "exp"
    schedule.total_steps = total_steps
    if schedule.shape == "exp" and decay != schedule.decay:
        epoch = step // schedule.steps_per_epoch
        schedule.decayed *= schedule.decay ** (epoch - schedule.decay_start)
        schedule.decay, schedule.decay_start = decay, epoch
    for group, base in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, strict=True):
        group["lr"] = base * schedule(step)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
    if not changed_length:
        return None
    return (f"learning rate: the {schedule.shape} schedule planned to end after epoch "
            f"{planned_epochs} now ends after epoch {total_steps // schedule.steps_per_epoch}; "
            f"the next step's rate is {scheduler._last_lr[0]:.3g}")


class WeightEMA:
    """A moving average of ``model``'s weights as a model of its own (``.module``), from the
    initial weights: ema <- d ema + (1 - d) weights after every optimiser step, with d the
    decay or, with warm-up, min(decay, (1 + n) / (10 + n)) at update n. Floating-point
    buffers are averaged, others copied. The update count lives on the device, so that an
    update reads nothing back (a CUDA graph can hold it). Not AveragedModel: its first update
    copies the weights, and it would average integer buffers."""

    def __init__(self, model: nn.Module, decay: float, warmup: bool = True):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), not {decay}")
        self.module = copy.deepcopy(unwrap(model)).eval().requires_grad_(False)
        self.decay, self.warmup = decay, warmup
        device = next(self.module.parameters()).device
        # the count in float64 (MPS has none: float32) so that the weight is the float rule's
        self.count = torch.zeros((), dtype=torch.float32 if device.type == "mps"
                                 else torch.float64, device=device)

    @property
    def updates(self) -> int:
        """Updates so far (a read-back: for checkpoints, not for the step)."""
        return int(self.count.item())

    def decay_at(self, update: int) -> float:
        """The decay of the ``update``-th (0-based) update."""
        return min(self.decay, (1 + update) / (10 + update)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Move the average towards ``model``'s current weights (on the device only)."""
        n = self.count
        decay = (((1 + n) / (10 + n)).clamp(max=self.decay) if self.warmup
                 else torch.full_like(n, self.decay))
        weight = (1.0 - decay).float()  # the float the lerp kernels take
        current = unwrap(model)
        pairs = zip(itertools.chain(self.module.parameters(), self.module.buffers()),
                    itertools.chain(current.parameters(), current.buffers()), strict=True)
        for average, now in pairs:
            if average.is_floating_point():
                average.lerp_(now.detach(), weight.to(average.dtype))
            else:
                average.copy_(now)
        n.add_(1)

    def state(self) -> dict:
        """Everything but the weights, for a checkpoint (the weights are ``module``'s)."""
        return {"decay": self.decay, "warmup": self.warmup, "updates": self.updates}

    def load(self, weights: dict, state: dict) -> None:
        """Inverse of saving ``module.state_dict()`` and :meth:`state`."""
        self.module.load_state_dict(weights)
        self.decay, self.warmup = state["decay"], state["warmup"]
        self.count.fill_(state["updates"])


@dataclass
class Training:
    """The model, its optimiser, the schedule and the moving average (or None); the loop
    moves the average and then the schedule after every optimiser step."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LambdaLR
    ema: WeightEMA | None = None

    @property
    def evaluated(self) -> nn.Module:
        """The plain model that is validated, selected, saved and tested: the EMA if any."""
        return unwrap(self.model) if self.ema is None else self.ema.module

    def modules(self) -> list[nn.Module]:
        """The plain models that compute: the trained one and the EMA."""
        return [unwrap(self.model)] + ([] if self.ema is None else [self.ema.module])

    def checkpoint_state(self) -> dict:
        """The optimiser and scheduler states and, with an EMA, the trained weights."""
        state = {"optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict()}
        if self.ema is not None:
            state.update(raw_state_dict=unwrap(self.model).state_dict(), ema=self.ema.state())
        return state

    def restore(self, payload: dict, path: object) -> str | None:
        """Load :meth:`checkpoint_state`'s dict and re-plan the schedule to this run's length
        and decay; returns a change of length for the log. CheckpointError for a schedule
        this version does not read."""
        if "lr_lambdas" not in payload["scheduler"]:
            raise CheckpointError(f"{path}: its learning-rate schedule was saved by an earlier "
                                  f"capsnet (per epoch) that this version cannot resume; "
                                  f"start the run again (its weights still evaluate)")
        planned = self.scheduler.lr_lambdas[0]  # this run's plan, before the saved one loads
        total_steps, decay = planned.total_steps, planned.decay
        trained = payload.get("raw_state_dict", payload["state_dict"])
        unwrap(self.model).load_state_dict(trained)
        if self.ema is not None:  # a checkpoint without one starts the average here
            self.ema.load(payload["state_dict"] if "ema" in payload else trained,
                          payload.get("ema", self.ema.state()))
        self.optimizer.load_state_dict(payload["optimizer"])
        self.scheduler.load_state_dict(payload["scheduler"])
        return replan(self.scheduler, total_steps, decay)


def build_training(settings: TrainSettings, overrides: dict, device: torch.device,
                   steps_per_epoch: int = 1) -> Training:
    """The model, Adam at the peak rate, the schedule and the EMA (``ema_decay`` > 0)."""
    derived = {**overrides, "use_decoder": settings.reconstruction_weight > 0}
    derived = {name: value for name, value in derived.items()  # what the data decides
               if has_option(settings.model, name)}
    config = make_config(settings.model, settings.preset,
                         **{**derived, **settings.model_options()})
    check_fits(config, settings.model)  # one line, not an allocator's crash
    model = build_model(config).to(device)
    if settings.cuda_graph and device.type == "cuda":  # a step a CUDA graph can hold
        optimizer = torch.optim.Adam(model.parameters(), capturable=True, fused=True,
                                     lr=torch.tensor(settings.lr, device=device))
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    ema = (WeightEMA(model, settings.ema_decay, settings.ema_warmup)
           if settings.ema_decay > 0 else None)
    return Training(model, optimizer, make_scheduler(optimizer, settings, steps_per_epoch), ema)


def initialise_from_data(training: Training, images: torch.Tensor | None) -> str | None:
    """Run the model's registry ``initialise`` step (EM: primary pose scale) on training
    ``images`` and restart the EMA from it; returns its description or None."""
    model = unwrap(training.model)
    initialise = entry_of(model.config).initialise
    if initialise is None or images is None:
        return None
    with torch.no_grad():
        described = initialise(model, images.to(next(model.parameters()).device))
    if training.ema is not None:
        training.ema.module.load_state_dict(model.state_dict())
    return described
