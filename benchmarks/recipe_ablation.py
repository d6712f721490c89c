"""The fast recipe's ingredients, one change per row, judged on validation accuracy only.

    PYTHONPATH=. python3 benchmarks/recipe_ablation.py --data-dir ~/mnist --out-dir runs/ablation

Every row trains the paper's CapsNet the same number of epochs (--epochs, default 5) on the
same images (the first --subset of MNIST's training pool, --val-size of them held out,
stratified, seed --seed); the rows differ in one setting of the recipe each:

- paper: Adam 1e-3 x 0.96 after every epoch, no average (the paper's schedule);
- fast: the fast recipe (capsnet.training.recipes.FAST_RECIPE), its warm-up scaled to the
  same share of the shorter run;
- fast without the average: the same run's trained weights, validated beside the
  average every epoch (metrics.csv's val_accuracy_raw): no extra training;
- fast at the paper's peak rate, fast without warm-up, fast with a step schedule instead
  of the cosine (exp), each its own run.

Calling again continues: finished rows are read back. The table (best and last validation
accuracy, minutes of training) is printed with the CPU's model and written to
--out-dir/ablation.json. The test set is never evaluated for a choice: each run tests once
at its end, as every run does, and the table leaves those figures out.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.time_to_accuracy import TINY, machine_line  # noqa: E402
from capsnet.devices import pick_device  # noqa: E402
from capsnet.models import MODELS  # noqa: E402
from capsnet.training.metrics_log import read_metrics  # noqa: E402
from capsnet.training.recipes import FAST_RECIPE  # noqa: E402
from capsnet.training.repeat import run_seed  # noqa: E402
from capsnet.training.settings import TrainSettings  # noqa: E402


def rows_to_run(epochs: int) -> dict[str, dict]:
    """Each row's name -> its settings beyond the shared ones (one change per row)."""
    warmup = FAST_RECIPE.warmup_epochs * epochs / FAST_RECIPE.epochs  # same share of the run
    fast = {"recipe": "fast", "warmup_epochs": warmup}
    return {
        "paper": {"recipe": "paper"},
        "fast": fast,
        "fast, peak 1e-3 (the paper's)": {**fast, "lr": MODELS["capsnet"].lr},
        "fast, no warm-up": {**fast, "warmup_epochs": 0.0},
        "fast, exp decay 0.96 instead of cosine": {**fast, "schedule": "exp"},
    }


def directory_name(row: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in row).strip("-").replace("--", "-")


def table_rows(out: Path, epochs: int) -> list[dict]:
    """One dict per row, from the runs' metrics.csv (the average's, and without it)."""
    rows = []
    for row in rows_to_run(epochs):
        run_dir = out / directory_name(row)
        metrics = read_metrics(run_dir) if (run_dir / "metrics.csv").is_file() else []
        rows.append(summary(row, metrics))
        if row == "fast":
            raw = [{**m, "val_accuracy": m.get("val_accuracy_raw")} for m in metrics]
            rows.append(summary("fast without the weight average (same run)", raw))
    return rows


def summary(name: str, metrics: list[dict]) -> dict:
    scores = [m["val_accuracy"] for m in metrics if m.get("val_accuracy") is not None]
    return {"row": name, "epochs": len(metrics),
            "best_val": max(scores, default=None), "last_val": scores[-1] if scores else None,
            "minutes": round(sum(m.get("epoch_seconds") or 0.0 for m in metrics) / 60.0, 1)}


def format_table(rows: list[dict]) -> str:
    def pct(x):
        return "-" if x is None else f"{100 * x:.2f}%"
    lines = ["| row | epochs | best validation | last validation | training minutes |",
             "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['row']} | {r['epochs']} | {pct(r['best_val'])} | {pct(r['last_val'])} "
              f"| {r['minutes']} |" for r in rows]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None, help="MNIST's directory (default: capsnet's)")
    p.add_argument("--out-dir", default="runs/recipe-ablation")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--subset", type=int, default=15000)
    p.add_argument("--val-size", type=int, default=5000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"))
    p.add_argument("--conv-impl", default="auto",
                   choices=("auto", "gemm", "native", "channels_last"))
    p.add_argument("--rows", default=None,
                   help="comma-separated row numbers (1-based) to train; default all")
    p.add_argument("--report-only", action="store_true", help="train nothing; print the table")
    p.add_argument("--tiny", action="store_true",
                   help="a smoke test in seconds: small preset, 300 images, 2 epochs, fp32")
    args = p.parse_args(argv)
    if args.tiny:
        args.epochs, args.subset, args.val_size = TINY["epochs"], TINY["subset"], TINY["val_size"]
        args.precision, args.conv_impl = TINY["precision"], TINY["conv_impl"]
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    out = Path(args.out_dir)
    rows = rows_to_run(args.epochs)
    chosen = (range(len(rows)) if args.rows is None
              else [int(i) - 1 for i in args.rows.split(",") if i])
    if not args.report_only:
        for index, (row, changes) in enumerate(rows.items()):
            if index not in chosen:
                continue
            print(f"== {row}")
            run_seed(TrainSettings(
                data_dir=args.data_dir, subset=args.subset, val_size=args.val_size,
                seed=args.seed, epochs=args.epochs, precision=args.precision,
                preset=TINY["preset"] if args.tiny else "paper", download=not args.tiny,
                conv_impl=args.conv_impl, progress=False,
                out_dir=str(out / directory_name(row)), **changes), argv, print)
    table = table_rows(out, args.epochs)
    machine = machine_line(pick_device("cpu"))
    print(f"recipe ablation: {args.epochs} epochs, {args.subset} images "
          f"({args.val_size} for validation), seed {args.seed}; {machine}")
    print(format_table(table))
    out.mkdir(parents=True, exist_ok=True)
    (out / "ablation.json").write_text(json.dumps(
        {"machine": machine, "epochs": args.epochs, "subset": args.subset,
         "val_size": args.val_size, "seed": args.seed, "rows": table}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
