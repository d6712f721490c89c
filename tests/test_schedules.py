"""Learning-rate schedules and the weights' moving average against hand computation; the
scheduler's state round trip that makes a resumed run continue its schedule exactly."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import ExponentialLR

from capsnet.checkpoint import CheckpointError
from capsnet.training.optimisation import (
    Schedule,
    WeightEMA,
    build_training,
    make_scheduler,
    replan,
)
from capsnet.training.settings import TrainSettings


def warmup_cosine(step: int, warmup_steps: int, total_steps: int, floor: float) -> float:
    return Schedule("cosine", warmup_steps, total_steps, floor, steps_per_epoch=1, decay=1.0)(step)


def exp_staircase(step: int, warmup_steps: int, steps_per_epoch: int, decay: float,
                  floor: float = 0.0) -> float:
    return Schedule("exp", warmup_steps, 0, floor, steps_per_epoch, decay)(step)


@pytest.mark.parametrize("step, expected", [
    (0, 0.25), (1, 0.5), (3, 1.0),  # linear warm-up over W = 4 steps: (s + 1) / 4
    (4, 1.0),  # the cosine starts at the peak
    (8, 0.01 + 0.99 * 0.5),  # half-way through T - W = 8 annealing steps: cos(pi/2) = 0
    (10, 0.01 + 0.99 * (1 + math.cos(math.pi * 0.75)) / 2),
    (12, 0.01), (20, 0.01),  # the floor at T, and after it
])
def test_warmup_cosine_by_hand(step, expected):
    value = warmup_cosine(step, warmup_steps=4, total_steps=12, floor=0.01)
    assert value == pytest.approx(expected)


@pytest.mark.parametrize("step, expected", [(0, 0.5), (1, 1.0), (4, 1.0), (5, 0.5), (12, 0.25)])
def test_exp_staircase_with_warm_up_by_hand(step, expected):
    # warm-up over 2 steps, epochs of 5 steps, x 0.5 per epoch
    assert exp_staircase(step, warmup_steps=2, steps_per_epoch=5, decay=0.5) == expected


def test_without_warm_up_no_step_is_scaled_down():
    assert warmup_cosine(0, 0, 10, 0.0) == 1.0
    assert exp_staircase(0, 0, 5, 0.5) == 1.0


def adam(lr: float = 1.0) -> torch.optim.Adam:
    return torch.optim.Adam([nn.Parameter(torch.zeros(2))], lr=lr)


def test_the_paper_schedule_is_exponential_per_epoch():
    optimizer, plain_optimizer = adam(), adam()
    scheduler = make_scheduler(optimizer, TrainSettings(), steps_per_epoch=3)
    plain = ExponentialLR(plain_optimizer, 0.96)
    used = rates(optimizer, scheduler, 3 * 40)
    assert used[::3] == pytest.approx(epoch_rates(plain_optimizer, plain, 40), rel=1e-12)
    assert used[:3] == [1.0] * 3  # the rate holds within an epoch


def epoch_rates(optimizer, scheduler, epochs: int) -> list[float]:
    used = []
    for _ in range(epochs):
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return used


def rates(optimizer, scheduler, steps: int) -> list[float]:
    """The rate each of ``steps`` optimiser steps uses."""
    used = []
    for _ in range(steps):
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return used


def restored(settings: TrainSettings, optimizer, scheduler, steps_per_epoch: int = 4):
    """A new optimiser and scheduler built for ``settings``, loaded from the given ones'
    states and re-planned to ``settings``' length; and the note replan returned."""
    resumed_optimizer = adam(settings.lr)
    resumed = make_scheduler(resumed_optimizer, settings, steps_per_epoch)
    planned = resumed.lr_lambdas[0]
    total_steps, decay = planned.total_steps, planned.decay
    resumed_optimizer.load_state_dict(optimizer.state_dict())
    resumed.load_state_dict(scheduler.state_dict())
    return resumed_optimizer, resumed, replan(resumed, total_steps, decay)


def test_cosine_is_set_every_step_and_resumes_with_its_own_length():
    settings = TrainSettings(recipe="fast", epochs=3, lr=2.0, min_lr=0.02, warmup_epochs=1)
    optimizer = adam(settings.lr)
    scheduler = make_scheduler(optimizer, settings, steps_per_epoch=4)
    first = rates(optimizer, scheduler, 5)
    assert first == pytest.approx([2.0 * warmup_cosine(s, 4, 12, 0.01) for s in range(5)])
    # resumed with its own length: the saved schedule goes on exactly, nothing re-planned
    resumed_optimizer, resumed, change = restored(settings, optimizer, scheduler)
    assert change is None
    assert rates(resumed_optimizer, resumed, 7) == rates(optimizer, scheduler, 7)
    assert resumed_optimizer.param_groups[0]["lr"] == pytest.approx(0.02)  # the floor at 12


def test_a_schedule_resumed_with_more_epochs_ends_at_the_new_end():
    """Stopped after 5 of 12 steps and resumed for 6 epochs (24 steps): the rates from step
    5 on are a 24-step cosine's; a finished run extended climbs off its floor."""
    settings = TrainSettings(recipe="fast", epochs=3, lr=2.0, min_lr=0.02, warmup_epochs=1)
    longer = TrainSettings(recipe="fast", epochs=6, lr=2.0, min_lr=0.02, warmup_epochs=1)
    optimizer = adam(settings.lr)
    scheduler = make_scheduler(optimizer, settings, steps_per_epoch=4)
    rates(optimizer, scheduler, 5)
    resumed_optimizer, resumed, change = restored(longer, optimizer, scheduler)
    next_rate = 2.0 * warmup_cosine(5, 4, 24, 0.01)
    assert change == ("learning rate: the cosine schedule planned to end after epoch 3 now ends "
                      f"after epoch 6; the next step's rate is {next_rate:.3g}")
    assert rates(resumed_optimizer, resumed, 19) == pytest.approx(
        [2.0 * warmup_cosine(s, 4, 24, 0.01) for s in range(5, 24)])
    assert resumed_optimizer.param_groups[0]["lr"] == pytest.approx(0.02)  # the new end
    rates(optimizer, scheduler, 7)  # the 3-epoch run to its end, at its floor
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.02)
    extended_optimizer, extended, _ = restored(longer, optimizer, scheduler)
    # step 12 of 24: half-way through 20 annealing steps, cos(pi 8 / 20)
    assert extended_optimizer.param_groups[0]["lr"] == pytest.approx(
        2.0 * (0.01 + 0.99 * (1 + math.cos(math.pi * 0.4)) / 2))
    # fewer epochs than planned anneal faster: the cosine given 4 epochs ends at step 16
    cycle = TrainSettings(recipe="fast", schedule="cosine", epochs=6, lr=2.0, min_lr=0.02,
                          warmup_epochs=1)
    cycle_optimizer = adam(cycle.lr)
    cycle_scheduler = make_scheduler(cycle_optimizer, cycle, steps_per_epoch=4)
    rates(cycle_optimizer, cycle_scheduler, 6)
    shorter = TrainSettings(recipe="fast", schedule="cosine", epochs=4, lr=2.0,
                            min_lr=0.02, warmup_epochs=1)
    short_optimizer, short, _ = restored(shorter, cycle_optimizer, cycle_scheduler)
    assert rates(short_optimizer, short, 10) == pytest.approx(
        [2.0 * warmup_cosine(s, 4, 16, 0.01) for s in range(6, 16)])


def test_the_exp_staircase_does_not_depend_on_the_run_length():
    settings = TrainSettings(lr=1.0, warmup_epochs=0.5, lr_decay=0.5, epochs=3)
    optimizer = adam(settings.lr)
    scheduler = make_scheduler(optimizer, settings, steps_per_epoch=4)
    rates(optimizer, scheduler, 6)
    longer = TrainSettings(lr=1.0, warmup_epochs=0.5, lr_decay=0.5, epochs=8)
    resumed_optimizer, resumed, change = restored(longer, optimizer, scheduler)
    assert change is None
    assert rates(resumed_optimizer, resumed, 6) == rates(optimizer, scheduler, 6)


def test_a_resume_with_another_lr_decay_decays_by_it_from_the_next_epoch_on():
    settings = TrainSettings(lr=1.0, lr_decay=0.5, epochs=6)
    optimizer = adam(settings.lr)
    scheduler = make_scheduler(optimizer, settings, steps_per_epoch=2)
    assert rates(optimizer, scheduler, 4) == [1.0, 1.0, 0.5, 0.5]
    faster = TrainSettings(lr=1.0, lr_decay=0.25, epochs=6)
    resumed_optimizer, resumed, change = restored(faster, optimizer, scheduler, 2)
    assert change is None
    assert rates(resumed_optimizer, resumed, 4) == [0.25, 0.25, 0.0625, 0.0625]


def test_warm_up_turns_the_exp_schedule_into_a_per_step_staircase():
    settings = TrainSettings(lr=1.0, warmup_epochs=0.5, lr_decay=0.5, epochs=3)
    optimizer = adam(settings.lr)
    scheduler = make_scheduler(optimizer, settings, steps_per_epoch=4)
    assert rates(optimizer, scheduler, 9) == pytest.approx([0.5, 1, 1, 1, 0.5, 0.5, 0.5, 0.5,
                                                            0.25])


class Scalar(nn.Module):
    """One weight and an integer buffer: an EMA small enough to follow by hand."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))


def set_weight(model: Scalar, value: float) -> None:
    with torch.no_grad():
        model.w.fill_(value)
        model.count += 1


def test_ema_two_steps_by_hand():
    model = Scalar()
    ema = WeightEMA(model, decay=0.5, warmup=False)
    set_weight(model, 1.0)
    ema.update(model)  # 0.5 * 0 + 0.5 * 1
    assert ema.module.w.item() == 0.5 and ema.module.count.item() == 1  # counters copied
    set_weight(model, 3.0)
    ema.update(model)  # 0.5 * 0.5 + 0.5 * 3
    assert ema.module.w.item() == 1.75 and ema.updates == 2
    assert model.w.item() == 3.0  # the model itself untouched


def test_ema_warm_up_two_steps_by_hand():
    model = Scalar()
    ema = WeightEMA(model, decay=0.999, warmup=True)
    assert ema.decay_at(0) == pytest.approx(0.1) and ema.decay_at(1) == pytest.approx(2 / 11)
    assert ema.decay_at(10**6) == 0.999
    set_weight(model, 1.0)
    ema.update(model)  # 0.1 * 0 + 0.9 * 1
    assert ema.module.w.item() == pytest.approx(0.9)
    set_weight(model, 3.0)
    ema.update(model)  # 2/11 * 0.9 + 9/11 * 3
    assert ema.module.w.item() == pytest.approx(28.8 / 11)


def test_ema_state_round_trip_continues_exactly():
    model = Scalar()
    ema = WeightEMA(model, decay=0.9)
    for value in (1.0, 2.0, 4.0):
        set_weight(model, value)
        ema.update(model)
    copy = WeightEMA(Scalar(), decay=0.5, warmup=False)
    copy.load(ema.module.state_dict(), ema.state())
    assert (copy.decay, copy.warmup, copy.updates) == (0.9, True, 3)
    set_weight(model, 8.0)
    ema.update(model)
    copy.update(model)
    assert copy.module.w.item() == ema.module.w.item()


def test_ema_decay_must_be_below_one():
    with pytest.raises(ValueError, match="decay"):
        WeightEMA(Scalar(), decay=1.0)


def test_a_per_epoch_schedule_of_an_earlier_version_is_one_clear_error():
    """The paper's schedule was an ExponentialLR stepped per epoch before: its checkpoints
    do not resume silently on another schedule."""
    settings = TrainSettings(model="cnn", preset="small", epochs=2)
    training = build_training(settings, {"image_size": 28, "num_classes": 10},
                              torch.device("cpu"))
    old = {"base_lrs": [1e-3], "last_epoch": 1, "gamma": 0.96, "min_lr": 0.0}
    with pytest.raises(CheckpointError, match="old.pt: its learning-rate schedule was saved by "
                                              "an earlier capsnet"):
        training.restore({"scheduler": old, "state_dict": {}, "optimizer": {}}, "old.pt")
