"""What a run trains and how, as one object: the model, Adam, the learning-rate scheduler
and the moving average of the weights; their part of a checkpoint and its restoring.

With an EMA, the average is the run's model: it is validated, selects the best epoch, is
saved as the checkpoint's ``state_dict`` (so `capsnet evaluate`, `predict`, `export` and
``best.pt`` all use the model that was validated) and is tested. The trained weights, which
a resumed run goes on from, are kept beside it as ``raw_state_dict``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.lr_scheduler import ExponentialLR, LRScheduler

from capsnet.config import make_config
from capsnet.models import build_model, unwrap
from capsnet.training.ema import WeightEMA
from capsnet.training.schedules import make_scheduler, replan_length, step_schedule
from capsnet.training.settings import TrainSettings


@dataclass
class Training:
    """The model, its optimiser, the scheduler (stepped after every optimiser step when
    ``per_step``, else after every epoch) and the EMA of the weights (None without)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    per_step: bool
    ema: WeightEMA | None = None

    @property
    def evaluated(self) -> nn.Module:
        """The plain model that is validated, selected, saved and tested: the EMA if any."""
        return unwrap(self.model) if self.ema is None else self.ema.module

    def modules(self) -> list[nn.Module]:
        """The plain models that compute: the trained one and the EMA."""
        return [unwrap(self.model)] + ([] if self.ema is None else [self.ema.module])

    def after_step(self) -> None:
        """After every optimiser step: a per-step schedule's next rate; the EMA's update."""
        if self.per_step:
            self.scheduler.step()
        if self.ema is not None:
            self.ema.update(self.model)

    def after_epoch(self) -> None:
        """After every epoch: the paper's decay."""
        if not self.per_step:
            self.scheduler.step()

    def checkpoint_state(self) -> dict:
        """A checkpoint's optimiser and scheduler states and, with an EMA, the trained
        weights and the EMA's counters (the checkpoint's state_dict is :attr:`evaluated`)."""
        state = {"optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict()}
        if self.ema is not None:
            state.update(raw_state_dict=unwrap(self.model).state_dict(), ema=self.ema.state())
        return state

    def restore(self, payload: dict, lr_decay: float) -> str | None:
        """Load a checkpoint written from :meth:`checkpoint_state`; the paper's decay goes on
        at ``lr_decay`` from the next epoch (a resumed run may anneal at a new rate), and a
        per-step schedule saved for another number of epochs ends where this run's settings
        plan it (:func:`replan_length`). Returns that change for the log, if any."""
        planned = step_schedule(self.scheduler)
        planned_steps = None if planned is None else planned.total_steps
        trained = payload.get("raw_state_dict", payload["state_dict"])
        unwrap(self.model).load_state_dict(trained)
        if self.ema is not None:  # a checkpoint without one starts the average here
            self.ema.load(payload["state_dict"] if "ema" in payload else trained,
                          payload.get("ema", self.ema.state()))
        self.optimizer.load_state_dict(payload["optimizer"])
        self.scheduler.load_state_dict(payload["scheduler"])
        if isinstance(self.scheduler, ExponentialLR):
            self.scheduler.gamma = lr_decay
        return None if planned_steps is None else replan_length(self.scheduler, planned_steps)


def build_training(settings: TrainSettings, overrides: dict, device: torch.device,
                   steps_per_epoch: int = 1) -> Training:
    """The model, Adam at the peak rate, the settings' schedule over ``steps_per_epoch``
    optimiser steps an epoch, and the EMA when ``settings.ema_decay`` > 0. Under DDP every
    rank builds the same (same seed), so every rank's EMA averages the same weights."""
    config = make_config(settings.model, settings.preset, **overrides,
                         routing=settings.routing,
                         routing_iterations=settings.routing_iterations,
                         use_decoder=settings.reconstruction_weight > 0,
                         decoder=settings.cnn_decoder)
    model = build_model(config).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.lr)
    scheduler, per_step = make_scheduler(optimizer, settings, steps_per_epoch)
    ema = (WeightEMA(model, settings.ema_decay, settings.ema_warmup)
           if settings.ema_decay > 0 else None)
    training = Training(model, optimizer, scheduler, per_step, ema)
    if per_step or ema is not None:  # every task's optimizer.step() drives them
        optimizer.register_step_post_hook(lambda *_: training.after_step())
    return training


def initialise_from_data(training: Training, images: torch.Tensor | None) -> str | None:
    """Let a model that has ``initialise_from_data(images) -> str`` (the EM model: its
    primary poses' scale) adjust its fresh weights to a batch of training ``images``, then
    start the weights' moving average from the adjusted weights. Returns the model's
    description of what it did; None when the model has no such step or there are no
    images. A resumed run never calls it: its weights come from the checkpoint."""
    model = unwrap(training.model)
    initialise = getattr(model, "initialise_from_data", None)
    if initialise is None or images is None:
        return None
    with torch.no_grad():
        described = initialise(images.to(next(model.parameters()).device))
    if training.ema is not None:
        training.ema.module.load_state_dict(model.state_dict())
    return described
