"""`capsnet train`, `evaluate` and `repeat`: training and honest evaluation."""
from __future__ import annotations

import argparse
import json

from capsnet.checkpoint import DEFAULT_WEIGHTS
from capsnet.cli import args as cli_args
from capsnet.inference import model_device
from capsnet.training.fit import fit
from capsnet.training.loop import evaluate
from capsnet.training.repeat import repeat_recipe
from capsnet.training.settings import AUGMENTATIONS
from capsnet.tuning import current_plan


def add_train(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a model",
                              description="Train CapsNet (or the paper's CNN baseline). Holds out "
                              "a validation split for model selection and tests once at the end.")
    add_train_args(p)
    cli_args.add_run_args(p, cli_args.DEFAULTS.out_dir)
    p.set_defaults(func=run_train)


def add_train_args(p: argparse.ArgumentParser) -> None:
    """The classification recipe's arguments, shared by `train` and `repeat`."""
    cli_args.add_recipe_args(p)
    p.add_argument("--augment", default=None, choices=AUGMENTATIONS,
                   help="training augmentation: 'shift' (random shifts of up to --max-shift "
                        "pixels, the CapsNet paper's) or 'efficient' (Efficient-CapsNet's "
                        "rotations, shifts into the free margins, squeezes and 4x4 erasing; "
                        "docs/models-efficient.md); default: the recipe's ('efficient' for "
                        "--model efficient under --recipe paper, else 'shift')")
    p.add_argument("--max-shift", type=int, default=None,
                   help=f"--augment shift: random shifts in pixels (0 disables; default: the "
                        f"recipe's, {cli_args.DEFAULTS.max_shift})")
    p.add_argument("--monitor-test", action="store_true",
                   help="also report test accuracy after every epoch (monitoring only)")


def run_train(args: argparse.Namespace, argv: list[str]) -> int:
    fit(cli_args.settings_from_args(args), resume=args.resume, argv=argv)
    return 0


def add_evaluate(subparsers) -> None:
    p = subparsers.add_parser(
        "evaluate", help="evaluate a checkpoint on the test set",
        description="Accuracy, per-class accuracy and the confusion matrix on the test set of "
        "the model's own dataset (or --dataset), read at the model's channels and size "
        "(the centre crop for a model trained on crops).")
    cli_args.add_model_args(p, checkpoint="positional")
    cli_args.add_data_args(p, model_default=True)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=run_evaluate)


def run_evaluate(args: argparse.Namespace, argv: list[str]) -> int:
    model = cli_args.load_cli_model(args)
    test = cli_args.load_cli_test_set(args, model.config).to(model_device(model))
    result = evaluate(model, test.images, test.labels, batch_size=args.batch_size)
    report = {"checkpoint": str(args.checkpoint or DEFAULT_WEIGHTS),
              "dataset": args.dataset or model.config.dataset, "images": len(test),
              "classes": list(test.classes), "precision": current_plan(model).precision,
              **result.as_dict()}
    print(json.dumps(report) if args.json else format_report(report, test.classes))
    return 0


def format_report(report: dict, classes: tuple[str, ...]) -> str:
    lines = [f"{report['checkpoint']} on {report['dataset']} test ({report['images']} images, "
             f"precision {report['precision']}: --precision to choose)",
             f"accuracy {report['accuracy']:.4f}   error {100 * report['error']:.2f}%", "",
             "per-class accuracy:"]
    width = max(len(c) for c in classes)
    lines += [f"  {c:>{width}}  {a:.4f}"
              for c, a in zip(classes, report["per_class_accuracy"], strict=False)]
    lines += ["", "confusion matrix (rows: true, columns: predicted, both in this order):"]
    lines += [f"  {c:>{width}} " + " ".join(f"{n:5d}" for n in row)
              for c, row in zip(classes, report["confusion"], strict=False)]
    return "\n".join(lines)


def add_repeat(subparsers) -> None:
    p = subparsers.add_parser(
        "repeat", help="train the same recipe over several seeds and summarise",
        description="Train once per seed (each run selects its epoch on its own validation "
        "split), then report the test error of those models as mean ± sample standard "
        "deviation, and separately the test error of their ensemble (averaged capsule "
        "lengths, from the test_scores.npy each run saves). Called again with the same "
        "--out-dir, it reads back complete seeds and resumes a stopped one.")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default 1,2,3)")
    p.add_argument("--out-dir", default="runs/repeat", help="parent directory of the runs")
    add_train_args(p)
    p.set_defaults(func=run_repeat)


def run_repeat(args: argparse.Namespace, argv: list[str]) -> int:
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if not seeds:
        raise ValueError("--seeds needs at least one seed")
    summary = repeat_recipe(cli_args.settings_from_args(args), seeds, args.out_dir, argv)
    if summary is not None:  # rank 0 (or the one process) summarises
        print(format_summary(summary))
    return 0


def format_summary(s: dict) -> str:
    """A table: one row per seed, the mean ± sample standard deviation, and the ensemble."""
    rows = [(f"seed {seed}", f"{100 * e:.2f}%")
            for seed, e in zip(s["seeds"], s["test_errors"], strict=True)]
    rows.append((f"mean ± std over {len(s['seeds'])} seeds",
                 f"{100 * s['test_error_mean']:.2f} ± {100 * s['test_error_std']:.2f}%"))
    rows.append((f"ensemble of {s['ensemble_size']} (averaged capsule lengths)",
                 f"{100 * s['ensemble_test_error']:.2f}%"))
    width = max(len(name) for name, _ in rows)
    lines = [f"test error, {s['protocol']}:"]
    lines += [f"  {name:<{width}}  {value:>14}" for name, value in rows]
    return "\n".join(lines)
