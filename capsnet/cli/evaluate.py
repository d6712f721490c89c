"""`capsnet evaluate`: test accuracy, per-class accuracy and confusion matrix of a checkpoint."""
from __future__ import annotations

import argparse
import json

from capsnet.cli.args import add_data_args, add_model_args, load_cli_model
from capsnet.data.datasets import load_split
from capsnet.loading import DEFAULT_WEIGHTS
from capsnet.training.loop import evaluate


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("evaluate", help="evaluate a checkpoint on the test set")
    add_model_args(p, checkpoint="positional")
    add_data_args(p)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    model = load_cli_model(args)
    test = load_split(args.dataset, "test", args.data_dir, args.download)
    test = test.to(next(model.parameters()).device)
    result = evaluate(model, test.images, test.labels, batch_size=args.batch_size)
    report = {"checkpoint": str(args.checkpoint or DEFAULT_WEIGHTS), "dataset": args.dataset,
              "images": len(test), **result.as_dict()}
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
    lines += ["", "confusion matrix (rows: true, columns: predicted):"]
    lines += ["  " + " ".join(f"{n:5d}" for n in row) for row in report["confusion"]]
    return "\n".join(lines)
