"""Training recipes by name and model (the paper's schedule and a fast one), defined once here.

A recipe fills every setting a run leaves None (epochs, batch, learning rate and its
schedule, EMA decay, augmentation), with the changes and peak rate the model's registry
entry names; what a run names explicitly wins."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from capsnet.models import model_entry

SCHEDULES = ("exp", "cosine", "onecycle")
AUGMENTATIONS = ("shift", "efficient")  # capsnet.training.loop.augment


@dataclass(frozen=True)
class Recipe:
    """The training schedule a run gets when it names only the recipe."""

    epochs: int
    batch_size: int
    lr_scale: float  # peak Adam rate as a multiple of the model's paper rate (1e-3 for CapsNet)
    schedule: str  # 'exp': x lr_decay after each epoch; 'cosine', 'onecycle': set every step
    lr_decay: float  # 'exp': the factor applied after each epoch
    warmup_epochs: float  # linear warm-up to the peak rate, in epochs (0: none)
    min_lr: float  # the floor: where 'cosine' and 'onecycle' end; 'exp' never goes below it
    ema_decay: float  # moving average of the weights, updated every step (0: none)
    ema_warmup: bool  # the average's decay ramps up as min(decay, (1 + n) / (10 + n))
    augment: str  # 'shift' (random shifts of up to max_shift pixels) or 'efficient'
    max_shift: int  # the 'shift' augmentation's pixels, when a run trains with it


# The paper's: Adam at 1e-3 decayed by 0.96 after each epoch, 2-pixel shifts, batch 128.
PAPER_RECIPE = Recipe(epochs=10, batch_size=128, lr_scale=1.0, schedule="exp", lr_decay=0.96,
                      warmup_epochs=0.0, min_lr=0.0, ema_decay=0.0, ema_warmup=False,
                      augment="shift", max_shift=2)

# Peak Adam 3 x the rate, one epoch of warm-up, cosine to 1e-5, EMA 0.999, chosen on
# validation only (docs/results.md, "The fast recipe: time to accuracy").
FAST_RECIPE = Recipe(epochs=15, batch_size=128, lr_scale=3.0, schedule="cosine", lr_decay=0.96,
                     warmup_epochs=1.0, min_lr=1e-5, ema_decay=0.999, ema_warmup=True,
                     augment="shift", max_shift=2)

# The recipes by name, as CapsNet trains under them.
RECIPES = {"paper": PAPER_RECIPE, "fast": FAST_RECIPE}


def recipe_for(name: str, model: str = "capsnet") -> Recipe:
    """The recipe ``name`` with ``model``'s changes; ValueError naming the choices otherwise."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")
    return dataclasses.replace(RECIPES[name], **model_entry(model).recipes.get(name, {}))


def default_lr(model: str, preset: str) -> float:
    """The Adam rate of a run that names none: the model's paper rate for the preset."""
    return model_entry(model).lr_for(preset)
