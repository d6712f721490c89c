"""`capsnet affnist train|evaluate`: the paper's affNIST protocol (40x40 placed MNIST
training, placed and affine-transformed test digits)."""
from __future__ import annotations

import argparse
import json

from capsnet.cli.args import (
    add_data_args,
    add_match_args,
    add_model_args,
    add_recipe_args,
    add_run_args,
    add_target_arg,
    settings_from_args,
)
from capsnet.cli.robustness import cli_models, first_on_device
from capsnet.data.datasets import load_split
from capsnet.data.transforms import AffineRanges
from capsnet.experiments.affnist import (
    CANVAS,
    TEST_SEED,
    compare,
    evaluation_sets,
    format_comparison,
    train_affnist,
)

EXAMPLES = 10  # digits drawn per test set with --examples


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("affnist", help="the paper's affNIST protocol (40x40 canvas)",
                              description=__doc__.split("`: ", 1)[1])
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    t = actions.add_parser("train", help="train on MNIST placed at random on a 40x40 canvas",
                           description="Train CapsNet or the CNN on MNIST digits placed at "
                           "fresh random positions on a black canvas each epoch (no other "
                           "augmentation), then test on placed MNIST and on the affine set.")
    add_recipe_args(t)
    add_target_arg(t)
    add_run_args(t, "runs/affnist")
    t.add_argument("--canvas", type=int, default=CANVAS, help=f"canvas size (default {CANVAS})")
    t.add_argument("--test-limit", type=int, default=None,
                   help="test the final model on the first N test digits only (default: all)")
    e = actions.add_parser("evaluate", help="compare checkpoints on placed MNIST and the "
                           "affine set", description=f"Affine set: {AffineRanges().describe()}.")
    e.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT",
                   help="checkpoints written by `capsnet affnist train` (run directories "
                        "with --matched)")
    add_match_args(e)
    e.add_argument("--labels", nargs="+", default=None, help="names of the models, in order")
    e.add_argument("--seed", type=int, default=TEST_SEED, help="seed of both test sets")
    e.add_argument("--limit", type=int, default=None, help="use the first N test digits only")
    add_data_args(e)
    add_model_args(e, checkpoint=None)
    e.add_argument("--batch-size", type=int, default=500)
    e.add_argument("--json", action="store_true", help="print machine-readable JSON")
    e.add_argument("--examples", default=None, metavar="PNG",
                   help="also draw the first test digits of both test sets into PNG")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    if args.action == "train":
        train_affnist(settings_from_args(args, task="affnist", max_shift=0), args.resume, argv)
        return 0
    return evaluate(args)


def evaluate(args: argparse.Namespace) -> int:
    models = cli_models(args)
    test = first_on_device(load_split(args.dataset, "test", args.data_dir, args.download),
                           models, args.limit)
    rows = compare(models, test.images, test.labels, args.seed, batch_size=args.batch_size)
    if args.examples:
        from capsnet.figures import examples_figure

        sample = test.images[:EXAMPLES]
        sets = evaluation_sets(sample, models[0].image_size, args.seed)
        examples_figure({"placed": sets["mnist"], "affine": sets["affine"]}, args.examples,
                      len(sample))
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"accuracy on {len(test)} {args.dataset} test digits at random places on the "
              f"canvas, and on the affine set ({AffineRanges().describe()}), seed {args.seed}")
        print(format_comparison(rows))
    return 0
