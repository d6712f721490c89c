"""`capsnet evaluate`: test accuracy, per-class accuracy and confusion matrix of a checkpoint."""
from __future__ import annotations

import argparse
import json

from capsnet.checkpoint import DEFAULT_WEIGHTS
from capsnet.cli.args import add_data_args, add_model_args, load_cli_model, load_cli_test_set
from capsnet.inference import model_device
from capsnet.training.loop import evaluate


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "evaluate", help="evaluate a checkpoint on the test set",
        description="Accuracy, per-class accuracy and the confusion matrix on the test set of "
        "the model's own dataset (or --dataset), read at the model's channels and size "
        "(the centre crop for a model trained on crops).")
    add_model_args(p, checkpoint="positional")
    add_data_args(p, model_default=True)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    model = load_cli_model(args)
    test = load_cli_test_set(args, model.config).to(model_device(model))
    result = evaluate(model, test.images, test.labels, batch_size=args.batch_size)
    report = {"checkpoint": str(args.checkpoint or DEFAULT_WEIGHTS),
              "dataset": args.dataset or model.config.dataset, "images": len(test),
              "classes": list(test.classes), **result.as_dict()}
    if args.json:
        print(json.dumps(report))
    else:
        print(format_report(report, test.classes))
    return 0


def format_report(report: dict, classes: tuple[str, ...]) -> str:
    lines = [f"{report['checkpoint']} on {report['dataset']} test ({report['images']} images)",
             f"accuracy {report['accuracy']:.4f}   error {100 * report['error']:.2f}%", "",
             "per-class accuracy:"]
    width = max(len(c) for c in classes)
    lines += [f"  {c:>{width}}  {a:.4f}"
              for c, a in zip(classes, report["per_class_accuracy"], strict=False)]
    lines += ["", "confusion matrix (rows: true, columns: predicted, both in this order):"]
    lines += [f"  {c:>{width}} " + " ".join(f"{n:5d}" for n in row)
              for c, row in zip(classes, report["confusion"], strict=False)]
    return "\n".join(lines)
