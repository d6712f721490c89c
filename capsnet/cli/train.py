"""`capsnet train`: train CapsNet or the CNN baseline."""
from __future__ import annotations

import argparse

from capsnet.cli.args import DEFAULTS, add_recipe_args, add_run_args, settings_from_args
from capsnet.training.fit import fit
from capsnet.training.settings import AUGMENTATIONS


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a model",
                              description="Train CapsNet (or the paper's CNN baseline). Holds out "
                              "a validation split for model selection and tests once at the end.")
    add_train_args(p)
    add_run_args(p, DEFAULTS.out_dir)
    p.set_defaults(func=run)


def add_train_args(p: argparse.ArgumentParser) -> None:
    """The classification recipe's arguments, shared by `train` and `repeat`."""
    add_recipe_args(p)
    p.add_argument("--augment", default=None, choices=AUGMENTATIONS,
                   help="training augmentation: 'shift' (random shifts of up to --max-shift "
                        "pixels, the CapsNet paper's) or 'efficient' (Efficient-CapsNet's "
                        "rotations, shifts into the free margins, squeezes and 4x4 erasing; "
                        "docs/models-efficient.md); default: the recipe's ('efficient' for "
                        "--model efficient under --recipe paper, else 'shift')")
    p.add_argument("--max-shift", type=int, default=None,
                   help=f"--augment shift: random shifts in pixels (0 disables; default: the "
                        f"recipe's, {DEFAULTS.max_shift})")
    p.add_argument("--monitor-test", action="store_true",
                   help="also report test accuracy after every epoch (monitoring only)")


def run(args: argparse.Namespace, argv: list[str]) -> int:
    fit(settings_from_args(args), resume=args.resume, argv=argv)
    return 0
