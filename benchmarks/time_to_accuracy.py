"""Time to accuracy: epochs and wall-clock minutes until the validation accuracy first
reaches 99.0%, 99.4% and 99.5%, for each training recipe, one seed each.

    PYTHONPATH=. python3 benchmarks/time_to_accuracy.py --data-dir ~/mnist --out-dir runs/tta

Each recipe trains through `capsnet train`'s library call in its own run directory,
--out-dir/<recipe> (the paper recipe for 40 epochs, the protocol run's, the fast one for its
own; --epochs sets both). Calling again continues: a complete run is read back, not
retrained, and a stopped one resumes from its last.pt; --time-limit stops this call's
training resumably before an epoch would overrun it. The table is read from each run's
metrics.csv: minutes are the sum of its epochs' training seconds (validation passes
excluded) up to the first epoch at or above the threshold. It is printed with the CPU's
model and flags and written to --out-dir/time_to_accuracy.json.

--tiny runs everything in seconds on the CPU (small preset, a few hundred images, 2 epochs,
fp32): a smoke test of the machinery, not a measurement.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from capsnet.devices import pick_device  # noqa: E402
from capsnet.training.metrics_log import read_metrics  # noqa: E402
from capsnet.training.recipes import RECIPES  # noqa: E402
from capsnet.training.repeat import run_seed  # noqa: E402
from capsnet.training.settings import TrainSettings  # noqa: E402
from capsnet.tuning.hardware import cpu_info, device_name  # noqa: E402

THRESHOLDS = (0.990, 0.994, 0.995)
EPOCHS = {"paper": 40}  # the protocol run's; other recipes train their own number
TINY = {"preset": "small", "subset": 300, "val_size": 100, "epochs": 2, "precision": "fp32",
        "conv_impl": "gemm"}
FLAG_PREFIXES = ("avx", "amx", "fma", "f16c")  # the CPU flags that decide its kernels


def first_reaching(rows: list[dict], threshold: float) -> dict | None:
    """{'epoch', 'minutes'} of the first epoch whose validation accuracy reaches
    ``threshold``, minutes summing epoch_seconds up to it; None if none does. ``rows`` are
    metrics.csv rows (a repeated epoch, from a resume, counts once: its last row)."""
    by_epoch = {row["epoch"]: row for row in rows}
    seconds = 0.0
    for epoch in sorted(by_epoch):
        row = by_epoch[epoch]
        seconds += row.get("epoch_seconds") or 0.0
        if (row.get("val_accuracy") or -1.0) >= threshold:
            return {"epoch": epoch, "minutes": round(seconds / 60.0, 2)}
    return None


def run_row(recipe: str, run_dir: Path, thresholds: tuple[float, ...]) -> dict:
    """One recipe's line of the table, from its run directory."""
    rows = read_metrics(run_dir) if (run_dir / "metrics.csv").is_file() else []
    results_path = run_dir / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    scored = [(r["val_accuracy"], r["epoch"]) for r in rows if r.get("val_accuracy") is not None]
    best = max(scored, key=lambda pair: (pair[0], -pair[1]), default=(None, None))
    tested = results.get("best", results.get("final"))
    return {"recipe": recipe, "run_dir": str(run_dir), "epochs": len({r["epoch"] for r in rows}),
            "complete": bool(results.get("complete", bool(results))),
            "best_val_accuracy": best[0], "best_epoch": best[1],
            "test_error": None if tested is None else tested["error"],
            "minutes": round(sum(r.get("epoch_seconds") or 0.0 for r in rows) / 60.0, 2),
            "reached": {f"{t:.3f}": first_reaching(rows, t) for t in thresholds}}


def machine_line(device) -> str:
    """The CPU model, its kernel-deciding flags and the threads torch uses (and the GPU)."""
    import torch

    model, flags = cpu_info()
    kept = sorted(f for f in flags if f.startswith(FLAG_PREFIXES))
    line = f"cpu: {model}; flags: {' '.join(kept) or 'none'}; threads {torch.get_num_threads()}"
    return line if device.type == "cpu" else f"{line}; device {device_name(device)}"


def format_table(rows: list[dict], thresholds: tuple[float, ...]) -> str:
    """The table: per recipe, epochs and minutes to each threshold, best validation, test."""
    head = ["recipe", "epochs", "min"] + [f"val>={100 * t:.1f}%" for t in thresholds] + [
        "best val (epoch)", "test err"]
    lines = [head]
    for row in rows:
        cells = [row["recipe"] + ("" if row["complete"] else " *"), str(row["epochs"]),
                 f"{row['minutes']:.1f}"]
        for t in thresholds:
            hit = row["reached"][f"{t:.3f}"]
            cells.append("-" if hit is None else f"ep {hit['epoch']}, {hit['minutes']:.1f} min")
        best = row["best_val_accuracy"]
        cells.append("-" if best is None else f"{100 * best:.2f}% ({row['best_epoch']})")
        error = row["test_error"]
        cells.append("-" if error is None else f"{100 * error:.2f}%")
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
            for line in lines]
    return "\n".join(text + ["(* not finished: call again to continue; minutes are training "
                             "time from metrics.csv, validation excluded)"])


def recipe_settings(args: argparse.Namespace, recipe: str, device: str) -> TrainSettings:
    """The run of ``recipe`` this benchmark trains."""
    values = dict(recipe=recipe, seed=args.seed, data_dir=args.data_dir, download=args.download,
                  device=device, out_dir=str(Path(args.out_dir) / recipe), progress=False,
                  precision=args.precision, conv_impl=args.conv_impl)
    if args.tiny:
        values.update(TINY)
    epochs = args.epochs or (None if args.tiny else EPOCHS.get(recipe))
    if epochs is not None:
        values["epochs"] = epochs
    if args.until_target:
        values["target_accuracy"] = max(args.thresholds)
    return TrainSettings(**values)


def train_recipes(args: argparse.Namespace, argv: list[str], log) -> None:
    """Start, resume or read back each recipe's run, within --time-limit for this call."""
    deadline = None if args.time_limit is None else time.monotonic() + args.time_limit
    for recipe in args.recipes:
        settings = recipe_settings(args, recipe, args.device)
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                log(f"{recipe}: no time left in --time-limit; call again to continue")
                continue
            settings.time_limit = left
        run_seed(settings, argv, log)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", default="paper,fast",
                   help=f"comma-separated, from {', '.join(RECIPES)} (default paper,fast)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out-dir", default="runs/time-to-accuracy",
                   help="parent of the runs, one directory per recipe")
    p.add_argument("--data-dir", default=None, help="MNIST's directory (default: capsnet's)")
    p.add_argument("--no-download", dest="download", action="store_false")
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda")
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs of every run (default: 40 for paper, the recipe's own else)")
    p.add_argument("--thresholds", default=",".join(f"{t:g}" for t in THRESHOLDS),
                   help="validation accuracies to time (default 0.99,0.994,0.995)")
    p.add_argument("--until-target", action="store_true",
                   help="stop each run at the first epoch reaching the highest threshold")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="stop this call's training before an epoch would overrun SECONDS "
                        "(resumable: call again)")
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"),
                   help="as `capsnet train --precision` (auto: measured)")
    p.add_argument("--conv-impl", default="auto",
                   choices=("auto", "gemm", "native", "channels_last"),
                   help="as `capsnet train --conv-impl` (auto: measured)")
    p.add_argument("--report-only", action="store_true", help="train nothing; print the table")
    p.add_argument("--tiny", action="store_true",
                   help="a smoke test in seconds on a CPU: small preset, 300 images, 2 epochs")
    args = p.parse_args(argv)
    args.recipes = [r for r in args.recipes.split(",") if r]
    args.thresholds = tuple(float(t) for t in args.thresholds.split(",") if t)
    unknown = [r for r in args.recipes if r not in RECIPES]
    if unknown or not args.recipes or not args.thresholds:
        p.error(f"--recipes from {', '.join(RECIPES)} (not {unknown}) and --thresholds needed")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    device = pick_device(args.device)
    if not args.report_only:
        train_recipes(args, argv, print)
    rows = [run_row(r, Path(args.out_dir) / r, args.thresholds) for r in args.recipes]
    machine = machine_line(device)
    print(f"time to validation accuracy, seed {args.seed}; {machine}")
    print(format_table(rows, args.thresholds))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "time_to_accuracy.json").write_text(json.dumps(
        {"machine": machine, "seed": args.seed, "thresholds": list(args.thresholds),
         "runs": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
