"""`capsnet evaluate`: test-set accuracy, per-class accuracy and confusion matrix of a checkpoint."""
from __future__ import annotations

import argparse
import json

from capsnet.cli.common import add_data_args, add_device_arg, add_speed_args
from capsnet.cli.model_args import for_inference
from capsnet.data.datasets import load_split
from capsnet.devices import pick_device
from capsnet.pretrained import DEFAULT_WEIGHTS, load_model
from capsnet.training.loop import evaluate


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("evaluate", help="evaluate a checkpoint on the test set")
    p.add_argument("checkpoint", nargs="?", default=None,
                   help="a .pt checkpoint written by `capsnet train` or a .safetensors weights "
                        "file (default: the trained CapsNet shipped with capsnet)")
    add_data_args(p)
    add_device_arg(p)
    add_speed_args(p)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    device = pick_device(args.device)
    model = for_inference(load_model(args.checkpoint, device), args)
    test = load_split(args.dataset, "test", args.data_dir, args.download).to(device)
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
    lines += [f"  {c:>{width}}  {a:.4f}" for c, a in zip(classes, report["per_class_accuracy"])]
    lines += ["", "confusion matrix (rows: true, columns: predicted):"]
    lines += ["  " + " ".join(f"{n:5d}" for n in row) for row in report["confusion"]]
    return "\n".join(lines)
