"""`capsnet repeat`: one recipe over several seeds; test error as mean ± std, and the ensemble."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from capsnet.cli.train import add_train_args, settings_from_args
from capsnet.data.datasets import load_split
from capsnet.devices import pick_device
from capsnet.ensemble import ensemble_accuracy, mean_std
from capsnet.training.checkpoint import model_from_checkpoint
from capsnet.training.fit import fit


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "repeat", help="train the same recipe over several seeds and summarise",
        description="Train once per seed (each run selects its epoch on its own validation "
        "split), then report the test error of those models as mean ± sample standard "
        "deviation, and separately the test error of their ensemble (averaged capsule lengths).")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default 1,2,3)")
    p.add_argument("--out-dir", default="runs/repeat", help="parent directory of the runs")
    add_train_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if not seeds:
        raise ValueError("--seeds needs at least one seed")
    out = Path(args.out_dir)
    checkpoints, errors = [], []
    for seed in seeds:
        settings = settings_from_args(args)
        settings.seed, settings.out_dir = seed, str(out / f"seed-{seed}")
        results = fit(settings, argv=argv)
        selected = results.get("best", results["final"])
        errors.append(selected["error"])
        checkpoints.append(Path(settings.out_dir) / "best.pt")
    summary = summarise(seeds, errors, checkpoints, args)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(format_summary(summary))
    return 0


def summarise(seeds, errors, checkpoints, args) -> dict:
    device = pick_device(args.device)
    test = load_split(args.dataset, "test", args.data_dir, args.download).to(device)
    models = [model_from_checkpoint(c, map_location=device) for c in checkpoints]
    mean, std = mean_std(errors)
    protocol = ("validation-selected epoch per seed" if args.val_size > 0
                else "final epoch per seed (no validation split)")
    return {"seeds": seeds, "protocol": protocol, "test_errors": errors,
            "test_error_mean": mean, "test_error_std": std,
            "ensemble_test_error": 1.0 - ensemble_accuracy(models, test.images, test.labels),
            "ensemble_size": len(models)}


def format_summary(s: dict) -> str:
    runs = ", ".join(f"seed {seed}: {100 * e:.2f}%" for seed, e in zip(s["seeds"], s["test_errors"]))
    return (f"test error over {len(s['seeds'])} seeds ({s['protocol']}): "
            f"{100 * s['test_error_mean']:.2f} ± {100 * s['test_error_std']:.2f}%  [{runs}]\n"
            f"ensemble of {s['ensemble_size']} models (averaged capsule lengths): "
            f"test error {100 * s['ensemble_test_error']:.2f}%")
