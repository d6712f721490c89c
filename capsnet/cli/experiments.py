"""`capsnet robustness`, `affnist` and `multimnist`: accuracy beyond the plain test set."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from capsnet.atomic import write_text
from capsnet.cli import args as cli_args
from capsnet.data.datasets import load_split
from capsnet.data.image_dataset import ImageDataset
from capsnet.data.transforms import AffineRanges, affine_set, angle_range, rotate
from capsnet.experiments import TEST_SEED, affnist, multimnist, robustness
from capsnet.inference import model_device
from capsnet.models import model_name_of

EXAMPLES = 10  # digits drawn per test set in the examples figures
FIGURE_PAIRS = 8

# The affine set's ranges described, for the parsers' help (made once, at import)
AFFINE_DESCRIPTION = AffineRanges().describe()


def add_compare_args(p: argparse.ArgumentParser, checkpoints_help: str) -> None:
    """The checkpoints compared, or with --matched run directories at one validation
    accuracy, and their --labels."""
    p.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help=checkpoints_help)
    p.add_argument("--matched", action="store_true",
                   help="the arguments are run directories; each stands for its earliest kept "
                        "checkpoint (last.pt, best.pt, epoch-NNN.pt from --keep-every) whose "
                        "validation accuracy reaches the highest level every run reached, so "
                        "the models are compared at the same validation accuracy")
    p.add_argument("--match-accuracy", type=float, default=None, metavar="ACC",
                   help="with --matched: compare at validation accuracy ACC instead")
    p.add_argument("--labels", nargs="+", default=None, help="names of the models, in order")


def compared_models(args: argparse.Namespace) -> list[robustness.NamedModel]:
    """The positional checkpoints loaded, with their --labels; with --matched, the checkpoint
    each run directory stands for (printed with its epoch and validation accuracy)."""
    paths = args.checkpoints
    if args.matched:
        from capsnet.experiments.matching import describe_match, matched_checkpoints

        level, chosen = matched_checkpoints(paths, args.match_accuracy)
        print(describe_match(level, chosen), file=sys.stderr)
        paths = [str(kept.path) for kept in chosen]
    elif args.match_accuracy is not None:
        raise ValueError("--match-accuracy needs --matched")
    models = [cli_args.load_cli_model(args, path) for path in paths]
    return robustness.named_models(paths, models, args.labels)


def first_on_device(test: ImageDataset, models: list[robustness.NamedModel],
                    limit: int | None) -> ImageDataset:
    """The first ``limit`` (default: all) images of ``test`` on the models' device."""
    test = test.to(model_device(models[0].model))
    return test if limit is None else test.subset(range(min(limit, len(test))))


def add_experiment_train(actions, help_text: str, out_dir: str,
                         models: tuple[str, ...] | None = None,
                         description: str | None = None) -> argparse.ArgumentParser:
    """An experiment's `train` action: the recipe, --target-accuracy and the run options."""
    t = actions.add_parser("train", help=help_text, description=description)
    cli_args.add_recipe_args(t, models)
    t.add_argument("--target-accuracy", type=float, default=None, metavar="ACC",
                   help="stop after the first epoch whose validation accuracy reaches ACC "
                        "(e.g. 0.99), to compare models at the same accuracy")
    cli_args.add_run_args(t, out_dir)
    return t


def add_robustness(subparsers) -> None:
    p = subparsers.add_parser(
        "robustness", help="accuracy on rotated and affine-transformed test digits",
        description="Evaluate checkpoints on their test set (MNIST for digit models; "
        "--dataset picks another) rotated from -MAX to +MAX "
        f"degrees and under seeded random affine transformations ({AFFINE_DESCRIPTION}). "
        "Every model sees the same transformed digits (models taking larger inputs see them "
        "centred on their canvas). Writes robustness.csv, robustness.png (accuracy against "
        "angle), examples.png and table.md into --out-dir.")
    add_compare_args(p, ".pt checkpoints or .safetensors weights (CapsNet or CNN); run "
                        "directories with --matched")
    p.add_argument("--max-angle", type=float, default=60.0, help="largest rotation (degrees)")
    p.add_argument("--step", type=float, default=15.0, help="angle step (degrees)")
    p.add_argument("--affine-seed", type=int, default=0, help="seed of the affine set")
    p.add_argument("--limit", type=int, default=None,
                   help="use the first N test images only (default: all 10,000)")
    cli_args.add_data_args(p, model_default=True)
    cli_args.add_model_args(p, checkpoint=None)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--out-dir", default="runs/robustness", help="where the CSV and plots go")
    p.set_defaults(func=run_robustness)


def run_robustness(args: argparse.Namespace, argv: list[str]) -> int:
    from capsnet.figures import examples_figure, rotation_figure

    models = compared_models(args)
    smallest = min(models, key=lambda m: m.image_size)  # larger canvases see its images centred
    test = first_on_device(cli_args.load_cli_test_set(args, smallest.model.config), models,
                           args.limit)
    robustness.input_size_check(models, test.images.shape[-1])
    angles = angle_range(args.max_angle, args.step)
    ranges = AffineRanges()
    rows = robustness.rotation_rows(models, test.images, test.labels, angles, args.batch_size)
    rows += robustness.affine_rows(models, test.images, test.labels, ranges, args.affine_seed,
                                   args.batch_size)
    affine_label = f"affine (seed {args.affine_seed})"
    out = Path(args.out_dir)
    robustness.write_csv(rows, out / "robustness.csv")
    write_text(out / "table.md", robustness.markdown_table(rows, affine_label) + "\n")
    dataset = args.dataset or smallest.model.config.dataset
    title = f"{dataset} test ({len(test)} images)\naffine set: {ranges.describe()}"
    rotation_figure(rows, out / "robustness.png", title)
    sample = test.images[:EXAMPLES]
    examples_figure({**{f"{a:+g} deg": rotate(sample, a) for a in angles},
                     "affine": affine_set(sample, ranges, args.affine_seed)},
                    out / "examples.png", min(EXAMPLES, len(sample)))
    print(f"accuracy (%) on {len(test)} {dataset} test images; "
          f"affine set: {ranges.describe()}")
    print(robustness.format_table(rows, affine_label))
    print(f"wrote {out / 'robustness.csv'}, {out / 'robustness.png'}, {out / 'examples.png'}, "
          f"{out / 'table.md'}")
    return 0


def add_affnist(subparsers) -> None:
    p = subparsers.add_parser("affnist", help="the paper's affNIST protocol (40x40 canvas)",
                              description="the paper's affNIST protocol (40x40 placed MNIST "
                              "training, placed and affine-transformed test digits).")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    t = add_experiment_train(
        actions, "train on MNIST placed at random on a 40x40 canvas", "runs/affnist",
        description="Train CapsNet or the CNN on MNIST digits placed at fresh random positions "
        "on a black canvas each epoch (no other augmentation), then test on placed MNIST and "
        "on the affine set.")
    t.add_argument("--canvas", type=int, default=affnist.CANVAS,
                   help=f"canvas size (default {affnist.CANVAS})")
    t.add_argument("--test-limit", type=int, default=None,
                   help="test the final model on the first N test digits only (default: all)")
    e = actions.add_parser("evaluate", help="compare checkpoints on placed MNIST and the "
                           "affine set", description=f"Affine set: {AFFINE_DESCRIPTION}.")
    add_compare_args(e, "checkpoints written by `capsnet affnist train` (run directories "
                        "with --matched)")
    e.add_argument("--seed", type=int, default=TEST_SEED, help="seed of both test sets")
    e.add_argument("--limit", type=int, default=None, help="use the first N test digits only")
    cli_args.add_data_args(e)
    cli_args.add_model_args(e, checkpoint=None)
    e.add_argument("--batch-size", type=int, default=500)
    e.add_argument("--json", action="store_true", help="print machine-readable JSON")
    e.add_argument("--examples", default=None, metavar="PNG",
                   help="also draw the first test digits of both test sets into PNG")
    p.set_defaults(func=run_affnist)


def run_affnist(args: argparse.Namespace, argv: list[str]) -> int:
    if args.action == "train":
        settings = cli_args.settings_from_args(args, task="affnist", max_shift=0)
        affnist.train_affnist(settings, args.resume, argv)
        return 0
    models = compared_models(args)
    test = first_on_device(load_split(args.dataset, "test", args.data_dir, args.download),
                           models, args.limit)
    rows = affnist.compare(models, test.images, test.labels, args.seed,
                           batch_size=args.batch_size)
    if args.examples:
        from capsnet.figures import examples_figure

        sample = test.images[:EXAMPLES]
        sets = affnist.evaluation_sets(sample, models[0].image_size, args.seed)
        examples_figure({"placed": sets["mnist"], "affine": sets["affine"]}, args.examples,
                        len(sample))
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"accuracy on {len(test)} {args.dataset} test digits at random places on the "
              f"canvas, and on the affine set ({AFFINE_DESCRIPTION}), seed {args.seed}")
        print(affnist.format_comparison(rows))
    return 0


def add_multimnist(subparsers) -> None:
    p = subparsers.add_parser("multimnist", help="MultiMNIST: overlapping digit pairs",
                              description="MultiMNIST (Sabour et al. 2017, section 6): two "
                              "digits of different classes, each shifted by up to 4 pixels, "
                              "overlaid on a 36x36 image. A pair is right when the two most "
                              "active capsules are its two digits.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    t = add_experiment_train(actions, "train a CapsNet on fresh pairs every epoch",
                             "runs/multimnist", models=("capsnet",))
    t.add_argument("--max-shift", type=int, default=multimnist.MAX_SHIFT,
                   help=f"each digit's shift in pixels (default {multimnist.MAX_SHIFT})")
    pairs = multimnist.TEST_PAIRS
    t.add_argument("--test-pairs", type=int, default=pairs,
                   help=f"test pairs made from the test digits (default {pairs})")
    e = actions.add_parser("evaluate", help="top-2 accuracy of a checkpoint on test pairs")
    f = actions.add_parser("figure", help="pairs and their two separate reconstructions")
    for q in (e, f):
        q.add_argument("checkpoint", help="a checkpoint written by `capsnet multimnist train`")
        q.add_argument("--seed", type=int, default=TEST_SEED, help="seed of the test pairs")
        cli_args.add_data_args(q)
        cli_args.add_model_args(q, checkpoint=None)
    e.add_argument("--pairs", type=int, default=pairs, help="number of test pairs")
    e.add_argument("--batch-size", type=int, default=500)
    e.add_argument("--json", action="store_true", help="print machine-readable JSON")
    f.add_argument("--count", type=int, default=FIGURE_PAIRS, help="pairs shown")
    f.add_argument("--out", default="multimnist.png", help="PNG file to write")
    p.set_defaults(func=run_multimnist)


def run_multimnist(args: argparse.Namespace, argv: list[str]) -> int:
    if args.action == "train":
        settings = cli_args.settings_from_args(args, task="multimnist")
        multimnist.train_multimnist(settings, args.resume, argv)
        return 0
    model = cli_args.load_cli_model(args)
    if model_name_of(model.config) != "capsnet":
        raise ValueError(f"{args.checkpoint}: MultiMNIST needs a CapsNet checkpoint")
    test = load_split(args.dataset, "test", args.data_dir, args.download).to(model_device(model))
    max_shift = multimnist.shift_for(model.config.image_size, test.images.shape[-1])
    count = args.pairs if args.action == "evaluate" else args.count
    pairs = multimnist.pair_set(test.images, test.labels, count, args.seed, max_shift)
    if args.action == "evaluate":
        result = multimnist.evaluate_pairs(model, pairs, args.batch_size)
        report = {"checkpoint": args.checkpoint, "seed": args.seed, **result}
        print(json.dumps(report) if args.json else
              f"{args.checkpoint}: {100 * result['accuracy']:.2f}% of {result['pairs']} test "
              f"pairs with both digits right (error {100 * result['error']:.2f}%), "
              f"seed {args.seed}")
        return 0
    from capsnet.figures import pairs_figure

    first, second, chosen = multimnist.reconstruct_pairs(model, pairs)
    print(f"wrote {pairs_figure(pairs.images, first, second, pairs.labels, chosen, args.out)}")
    return 0
