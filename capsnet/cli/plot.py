"""`capsnet plot RUN_DIR`: training and validation curves from a run's metrics log."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from capsnet.training.metrics_log import read_metrics


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("plot", help="training curves of a run as a PNG",
                              description="Plot loss and error rate per epoch from the "
                              "metrics.csv of a run directory written by `capsnet train`.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory (holds metrics.csv)")
    p.add_argument("--out", default=None, help="PNG file to write (default: RUN_DIR/curves.png)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from capsnet.figures import training_curves_figure

    run_dir = Path(args.run_dir)
    if not (run_dir / "metrics.csv").is_file():
        raise FileNotFoundError(f"{run_dir}: no metrics.csv here (expected a run directory "
                                "written by `capsnet train`)")
    rows = read_metrics(run_dir)
    if not rows:
        raise ValueError(f"{run_dir / 'metrics.csv'}: no epochs logged yet")
    out = Path(args.out) if args.out else run_dir / "curves.png"
    path = training_curves_figure(rows, out, title=run_title(run_dir, len(rows)))
    print(f"wrote {path}: {len(rows)} epochs")
    return 0


def run_title(run_dir: Path, epochs: int) -> str:
    """'<run dir>: N epochs', with the final test accuracy when results.json has it."""
    title = f"{run_dir}: {epochs} epochs"
    try:
        results = json.loads((run_dir / "results.json").read_text())
        accuracy = results["best"]["accuracy"]
    except (OSError, ValueError, KeyError, TypeError):
        return title
    return f"{title}; test accuracy {accuracy:.4f} (validation-selected epoch)"
