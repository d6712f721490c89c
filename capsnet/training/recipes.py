"""Training recipes by name: the paper's schedule and a fast one, each defined once here.

A recipe fills every training setting a run leaves unset (``None`` in
:class:`~capsnet.training.settings.TrainSettings`): the number of epochs, the batch size,
the peak learning rate, its schedule and warm-up, the floor a cosine ends at, the decay of
the weights' moving average and the shift augmentation. What a run names explicitly wins.
The model and its losses are the same in every recipe.
"""
from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("exp", "cosine", "onecycle")


@dataclass(frozen=True)
class Recipe:
    """The training schedule a run gets when it names only the recipe."""

    epochs: int
    batch_size: int
    lr_scale: float  # peak Adam rate as a multiple of the model's paper rate (1e-3 for CapsNet)
    schedule: str  # 'exp': x lr_decay after each epoch; 'cosine', 'onecycle': set every step
    warmup_epochs: float  # linear warm-up to the peak rate, in epochs (0: none)
    min_lr: float  # where 'cosine' and 'onecycle' end, at the run's last step
    ema_decay: float  # moving average of the weights, updated every step (0: none)
    ema_warmup: bool  # the average's decay ramps up as min(decay, (1 + n) / (10 + n))
    max_shift: int  # random shifts of up to this many pixels


# The paper's: Adam at 1e-3 decayed by 0.96 after each epoch, 2-pixel shifts, batch 128.
PAPER_RECIPE = Recipe(epochs=10, batch_size=128, lr_scale=1.0, schedule="exp",
                      warmup_epochs=0.0, min_lr=0.0, ema_decay=0.0, ema_warmup=False,
                      max_shift=2)

# Placeholders from public CapsNet and short-schedule practice (peak Adam 2e-3..3e-3, one
# epoch of warm-up, cosine to ~1e-5, EMA 0.999), to be replaced by measurement
# (benchmarks/time_to_accuracy.py), chosen on validation accuracy only.
FAST_RECIPE = Recipe(epochs=15, batch_size=128, lr_scale=3.0, schedule="cosine",
                     warmup_epochs=1.0, min_lr=1e-5, ema_decay=0.999, ema_warmup=True,
                     max_shift=2)

RECIPES = {"paper": PAPER_RECIPE, "fast": FAST_RECIPE}


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; a ValueError naming the choices otherwise."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")
    return RECIPES[name]
