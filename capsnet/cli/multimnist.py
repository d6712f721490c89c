"""`capsnet multimnist train|evaluate|figure`: overlapping digit pairs (paper section 6)."""
from __future__ import annotations

import argparse
import json

from capsnet.cli.args import (
    add_data_args,
    add_model_args,
    add_recipe_args,
    add_run_args,
    add_target_arg,
    load_cli_model,
    settings_from_args,
)
from capsnet.data.datasets import load_split
from capsnet.experiments import TEST_SEED
from capsnet.experiments.multimnist import (
    MAX_SHIFT,
    TEST_PAIRS,
    evaluate_pairs,
    pair_set,
    reconstruct_pairs,
    shift_for,
    train_multimnist,
)
from capsnet.inference import model_device
from capsnet.models import model_name_of

FIGURE_PAIRS = 8


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("multimnist", help="MultiMNIST: overlapping digit pairs",
                              description="MultiMNIST (Sabour et al. 2017, section 6): two "
                              "digits of different classes, each shifted by up to 4 pixels, "
                              "overlaid on a 36x36 image. A pair is right when the two most "
                              "active capsules are its two digits.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    t = actions.add_parser("train", help="train a CapsNet on fresh pairs every epoch")
    add_recipe_args(t, models=("capsnet",))
    add_target_arg(t)
    add_run_args(t, "runs/multimnist")
    t.add_argument("--max-shift", type=int, default=MAX_SHIFT,
                   help=f"each digit's shift in pixels (default {MAX_SHIFT})")
    t.add_argument("--test-pairs", type=int, default=TEST_PAIRS,
                   help=f"test pairs made from the test digits (default {TEST_PAIRS})")
    e = actions.add_parser("evaluate", help="top-2 accuracy of a checkpoint on test pairs")
    f = actions.add_parser("figure", help="pairs and their two separate reconstructions")
    for q in (e, f):
        q.add_argument("checkpoint", help="a checkpoint written by `capsnet multimnist train`")
        q.add_argument("--seed", type=int, default=TEST_SEED, help="seed of the test pairs")
        add_data_args(q)
        add_model_args(q, checkpoint=None)
    e.add_argument("--pairs", type=int, default=TEST_PAIRS, help="number of test pairs")
    e.add_argument("--batch-size", type=int, default=500)
    e.add_argument("--json", action="store_true", help="print machine-readable JSON")
    f.add_argument("--count", type=int, default=FIGURE_PAIRS, help="pairs shown")
    f.add_argument("--out", default="multimnist.png", help="PNG file to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    if args.action == "train":
        train_multimnist(settings_from_args(args, task="multimnist"), args.resume, argv)
        return 0
    model = load_cli_model(args)
    if model_name_of(model.config) != "capsnet":
        raise ValueError(f"{args.checkpoint}: MultiMNIST needs a CapsNet checkpoint")
    test = load_split(args.dataset, "test", args.data_dir, args.download)
    test = test.to(model_device(model))
    max_shift = shift_for(model.config.image_size, test.images.shape[-1])
    count = args.pairs if args.action == "evaluate" else args.count
    pairs = pair_set(test.images, test.labels, count, args.seed, max_shift)
    if args.action == "evaluate":
        result = evaluate_pairs(model, pairs, args.batch_size)
        report = {"checkpoint": args.checkpoint, "seed": args.seed, **result}
        print(json.dumps(report) if args.json else
              f"{args.checkpoint}: {100 * result['accuracy']:.2f}% of {result['pairs']} test "
              f"pairs with both digits right (error {100 * result['error']:.2f}%), "
              f"seed {args.seed}")
        return 0
    from capsnet.figures import pairs_figure

    first, second, chosen = reconstruct_pairs(model, pairs)
    path = pairs_figure(pairs.images, first, second, pairs.labels, chosen, args.out)
    print(f"wrote {path}")
    return 0
