"""`capsnet robustness`: accuracy of several checkpoints on rotated and affine-transformed
MNIST test digits, as a table, a CSV file and a plot."""
from __future__ import annotations

import argparse
from pathlib import Path

from capsnet.cli.args import (
    add_data_args,
    add_match_args,
    add_model_args,
    load_cli_model,
    load_cli_test_set,
    matched_sources,
)
from capsnet.data.image_dataset import ImageDataset
from capsnet.data.transforms import AffineRanges, affine_set, angle_range, rotate
from capsnet.experiments.robustness import (
    NamedModel,
    affine_rows,
    format_table,
    input_size_check,
    markdown_table,
    named_models,
    rotation_rows,
    write_csv,
)
from capsnet.inference import model_device

EXAMPLES = 10  # digits shown per row in examples.png


def add_parser(subparsers) -> None:
    ranges = AffineRanges()
    p = subparsers.add_parser(
        "robustness", help="accuracy on rotated and affine-transformed test digits",
        description="Evaluate checkpoints on their test set (MNIST for digit models; "
        "--dataset picks another) rotated from -MAX to +MAX "
        f"degrees and under seeded random affine transformations ({ranges.describe()}). "
        "Every model sees the same transformed digits (models taking larger inputs see them "
        "centred on their canvas). Writes robustness.csv, robustness.png (accuracy against "
        "angle), examples.png and table.md into --out-dir.")
    p.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT",
                   help=".pt checkpoints or .safetensors weights (CapsNet or CNN); run "
                        "directories with --matched")
    add_match_args(p)
    p.add_argument("--labels", nargs="+", default=None, help="names of the models, in order")
    p.add_argument("--max-angle", type=float, default=60.0, help="largest rotation (degrees)")
    p.add_argument("--step", type=float, default=15.0, help="angle step (degrees)")
    p.add_argument("--affine-seed", type=int, default=0, help="seed of the affine set")
    p.add_argument("--limit", type=int, default=None,
                   help="use the first N test images only (default: all 10,000)")
    add_data_args(p, model_default=True)
    add_model_args(p, checkpoint=None)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--out-dir", default="runs/robustness", help="where the CSV and plots go")
    p.set_defaults(func=run)


def cli_models(args: argparse.Namespace) -> list[NamedModel]:
    """The positional checkpoints (or matched runs) loaded, with their --labels."""
    paths = matched_sources(args, args.checkpoints)
    return named_models(paths, [load_cli_model(args, path) for path in paths], args.labels)


def first_on_device(test: ImageDataset, models: list[NamedModel],
                    limit: int | None) -> ImageDataset:
    """The first ``limit`` (default: all) images of ``test`` on the models' device."""
    test = test.to(model_device(models[0].model))
    return test if limit is None else test.subset(range(min(limit, len(test))))


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from capsnet.figures import examples_figure, rotation_figure

    models = cli_models(args)
    smallest = min(models, key=lambda m: m.image_size)  # larger canvases see its images centred
    test = first_on_device(load_cli_test_set(args, smallest.model.config), models, args.limit)
    input_size_check(models, test.images.shape[-1])
    angles = angle_range(args.max_angle, args.step)
    ranges = AffineRanges()
    rows = rotation_rows(models, test.images, test.labels, angles, args.batch_size)
    rows += affine_rows(models, test.images, test.labels, ranges, args.affine_seed,
                        args.batch_size)
    affine_label = f"affine (seed {args.affine_seed})"
    out = Path(args.out_dir)
    write_csv(rows, out / "robustness.csv")
    (out / "table.md").write_text(markdown_table(rows, affine_label) + "\n")
    dataset = args.dataset or smallest.model.config.dataset
    title = f"{dataset} test ({len(test)} images)\naffine set: {ranges.describe()}"
    rotation_figure(rows, out / "robustness.png", title)
    sample = test.images[:EXAMPLES]
    examples_figure({**{f"{a:+g} deg": rotate(sample, a) for a in angles},
                   "affine": affine_set(sample, ranges, args.affine_seed)},
                  out / "examples.png", min(EXAMPLES, len(sample)))
    print(f"accuracy (%) on {len(test)} {dataset} test images; "
          f"affine set: {ranges.describe()}")
    print(format_table(rows, affine_label))
    print(f"wrote {out / 'robustness.csv'}, {out / 'robustness.png'}, {out / 'examples.png'}, "
          f"{out / 'table.md'}")
    return 0
