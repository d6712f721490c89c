"""Arguments shared by the commands that train under a robustness protocol
(`capsnet affnist train`, `capsnet multimnist train`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from capsnet.cli.common import add_device_arg, add_speed_args
from capsnet.cli.train import DEFAULTS, add_recipe_args
from capsnet.models import model_name_of
from capsnet.pretrained import load_model
from capsnet.robustness import NamedModel
from capsnet.training.settings import TrainSettings


def add_training_args(p: argparse.ArgumentParser, out_dir: str, models=("capsnet", "cnn"),
                      max_shift: int | None = None, precision: bool = True) -> None:
    """The options of `capsnet train` that these protocols use, plus --target-accuracy.
    ``max_shift`` adds --max-shift with that default (MultiMNIST's digit shift);
    ``precision`` adds --precision (the protocols whose loop supports autocast)."""
    add_recipe_args(p, models)
    if max_shift is not None:
        p.add_argument("--max-shift", type=int, default=max_shift,
                       help=f"each digit's shift in pixels (default {max_shift})")
    p.add_argument("--subset", type=int, default=None,
                   help="train on the first N images of the training pool")
    p.add_argument("--val-size", type=int, default=DEFAULTS.val_size,
                   help="validation digits held out of the training set")
    p.add_argument("--target-accuracy", type=float, default=None, metavar="ACC",
                   help="stop after the first epoch whose validation accuracy reaches ACC "
                        "(e.g. 0.99), to compare models at the same accuracy")
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    add_device_arg(p)
    if precision:
        add_speed_args(p)
    p.add_argument("--out-dir", default=out_dir, help=f"run directory (default {out_dir})")


def settings_from(args: argparse.Namespace, **fixed) -> TrainSettings:
    """TrainSettings from the parsed options (``fixed`` values override them)."""
    values = {k: v for k, v in vars(args).items() if k in TrainSettings.__dataclass_fields__}
    return TrainSettings(**{**values, **fixed, "progress": False})


def load_named_models(paths: list[str], labels: list[str] | None, device) -> list[NamedModel]:
    """The models of checkpoints or weights files, on ``device``, with their labels."""
    models = [load_model(path, device) for path in paths]
    return [NamedModel(label, model) for label, model
            in zip(model_labels(paths, models, labels), models)]


def model_labels(paths: list[str], models, given: list[str] | None) -> list[str]:
    """Labels for the models in tables and plots: ``given``, or 'capsnet (run-dir)'."""
    if given:
        if len(given) != len(paths):
            raise ValueError(f"{len(given)} labels for {len(paths)} checkpoints")
        return list(given)
    labels = []
    for path, model in zip(paths, models):
        name = model_name_of(model.config)
        where = Path(path).resolve().parent.name
        label = f"{name} ({where})"
        labels.append(label if label not in labels else f"{label} #{len(labels) + 1}")
    return labels
