"""`capsnet train`: train CapsNet or the CNN baseline."""
from __future__ import annotations

import argparse

from capsnet.cli.common import add_data_args, add_device_arg, add_speed_args
from capsnet.config import PRESETS
from capsnet.training.fit import fit
from capsnet.training.settings import TrainSettings

DEFAULTS = TrainSettings()
RESUME_OVERRIDES = ("epochs", "device", "progress")  # always taken from the resuming command
RESUME_OPTIONAL_OVERRIDES = ("lr_decay",)  # taken from it only when given there


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a model",
                              description="Train CapsNet (or the paper's CNN baseline). Holds out "
                              "a validation split for model selection and tests once at the end.")
    add_train_args(p)
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    p.add_argument("--out-dir", default=None,
                   help=f"run directory (default: {DEFAULTS.out_dir}; with --resume: the "
                   "directory of the resumed checkpoint)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR_OR_CHECKPOINT",
                   help="continue a stopped run (its settings are reused; --epochs may extend it "
                   "and --lr-decay may change the decay from the next epoch on)")
    # None = not given: a resumed run then keeps its own decay (a fresh run gets the default)
    p.set_defaults(func=run, **{name: None for name in RESUME_OPTIONAL_OVERRIDES})


def add_recipe_args(p, models=("capsnet", "cnn")) -> None:
    """Model, data and optimisation options, shared by `train`, `repeat` and the protocols."""
    p.add_argument("--model", default=models[0], choices=list(models))
    p.add_argument("--preset", default=DEFAULTS.preset, choices=sorted(PRESETS),
                   help="layer sizes: 'paper' or the narrow 'small' for quick CPU runs")
    add_data_args(p)
    p.add_argument("--epochs", type=int, default=DEFAULTS.epochs)
    p.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size,
                   help="global batch (split over the processes under torchrun)")
    p.add_argument("--lr", type=float, default=DEFAULTS.lr, help="Adam learning rate")
    p.add_argument("--lr-decay", type=float, default=DEFAULTS.lr_decay,
                   help="learning-rate factor applied after each epoch")
    p.add_argument("--routing-iterations", type=int, default=DEFAULTS.routing_iterations)
    p.add_argument("--reconstruction-weight", type=float, default=DEFAULTS.reconstruction_weight,
                   help="0 trains CapsNet without the decoder")


def add_train_args(p) -> None:
    """The recipe's arguments, shared by `train` and `repeat`."""
    add_recipe_args(p)
    p.add_argument("--max-shift", type=int, default=DEFAULTS.max_shift,
                   help="random shift augmentation in pixels (0 disables)")
    p.add_argument("--subset", type=int, default=None,
                   help="train on the first N images of the training pool")
    p.add_argument("--val-size", type=int, default=DEFAULTS.val_size,
                   help="validation images held out of the training set (0: train on all)")
    add_device_arg(p)
    add_speed_args(p)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--monitor-test", action="store_true",
                   help="also report test accuracy after every epoch (monitoring only)")
    p.add_argument("--no-progress", dest="progress", action="store_false")


def settings_from_args(args: argparse.Namespace) -> TrainSettings:
    """The settings given on the command line; an option left at None takes the dataclass
    default (None there too, except for the resume overrides left unset)."""
    return TrainSettings(**{k: v for k, v in vars(args).items()
                            if k in TrainSettings.__dataclass_fields__ and v is not None})


def run(args: argparse.Namespace, argv: list[str]) -> int:
    settings = settings_from_args(args)
    if args.resume:
        settings = _settings_for_resume(args, settings)
    elif args.out_dir is None:
        settings.out_dir = DEFAULTS.out_dir
    fit(settings, resume=args.resume, argv=argv)
    return 0


def _settings_for_resume(args: argparse.Namespace, given: TrainSettings) -> TrainSettings:
    """The stopped run's own settings, with epochs, device and progress taken from this
    command line, and the learning-rate decay too when it is given there (a run may be
    annealed faster from the next epoch on). The run goes on in --out-dir if given, else in
    the resumed checkpoint's directory (the saved out_dir may be relative to another working
    directory)."""
    from capsnet.training.checkpoint import load_checkpoint
    from capsnet.training.fit import resolve_resume

    checkpoint = resolve_resume(args.resume)
    saved = load_checkpoint(checkpoint).get("train_settings")
    settings = given if saved is None else TrainSettings.from_dict(saved)
    given_optional = tuple(name for name in RESUME_OPTIONAL_OVERRIDES
                           if getattr(args, name) is not None)
    for name in RESUME_OVERRIDES + given_optional:
        setattr(settings, name, getattr(given, name))
    settings.out_dir = args.out_dir or str(checkpoint.parent)
    return settings
