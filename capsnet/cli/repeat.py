"""`capsnet repeat`: one recipe over several seeds; test error as mean ± std, and the ensemble."""
from __future__ import annotations

import argparse

from capsnet.cli.args import settings_from_args
from capsnet.cli.train import add_train_args
from capsnet.training.repeat import repeat_recipe


def add_parser(subparsers) -> None:
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if not seeds:
        raise ValueError("--seeds needs at least one seed")
    settings = settings_from_args(args)
    summary = repeat_recipe(settings, seeds, args.out_dir, argv)
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
