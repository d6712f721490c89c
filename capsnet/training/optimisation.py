"""What a run trains and how: the model, Adam, the scheduler and the EMA of the weights, and
their part of a checkpoint. With an EMA, the average is the run's model (validated, saved as
``state_dict``, tested); the trained weights are kept as ``raw_state_dict``."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.lr_scheduler import ExponentialLR, LRScheduler

from capsnet.models import build_model, entry_of, has_option, make_config, unwrap
from capsnet.training.ema import WeightEMA
from capsnet.training.schedules import make_scheduler, replan_length, step_schedule
from capsnet.training.settings import TrainSettings


@dataclass
class Training:
    """The model, its optimiser, the scheduler (per step when ``per_step``) and the EMA or None."""

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
        """The optimiser and scheduler states and, with an EMA, the trained weights."""
        state = {"optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict()}
        if self.ema is not None:
            state.update(raw_state_dict=unwrap(self.model).state_dict(), ema=self.ema.state())
        return state

    def restore(self, payload: dict, lr_decay: float) -> str | None:
        """Load :meth:`checkpoint_state`'s dict; a per-step schedule is re-planned to this run's
        length. Returns that change for the log, if any."""
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
    """The model, Adam at the peak rate, the schedule and the EMA (``ema_decay`` > 0)."""
    derived = {**overrides, "use_decoder": settings.reconstruction_weight > 0}
    derived = {name: value for name, value in derived.items()  # what the data decides
               if has_option(settings.model, name)}
    config = make_config(settings.model, settings.preset,
                         **{**derived, **settings.model_options()})
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
