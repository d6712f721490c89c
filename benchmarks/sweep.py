"""One way to run a benchmark sweep: variants x data sets -> one Markdown table per data set
and one JSON report. A study (routing_zoo, time_to_accuracy, own_data_study) declares its
variants as `capsnet train` options in a :class:`Study` and calls :func:`main`.

Every run is `capsnet train` with the data set's options, the variant's and the sweep's
(seed, epochs, precision, ...), trained by the library (capsnet.training.repeat.run_seed) in
OUT/<data set>/<variant>: calling again reads a complete run back and resumes a stopped one
from its last.pt; --time-limit stops this call's training resumably. The epoch is selected
by validation accuracy and the test set is evaluated once. A table row, read from the run
directory (metrics.csv, results.json): test accuracy, best validation accuracy (its epoch),
epochs trained (training minutes: epoch_seconds summed, validation excluded), the median
training images/s, and for each target the first epoch whose validation accuracy reaches it
(training minutes up to it). A figure missing (a run not finished) is printed '-'.

Data sets: mnist (--data-dir), fashion-mnist (--fashion-dir, default: the usual lookup),
fashion-grey (its first 3,000 training images) and the folder sets of
`python -m benchmarks.make_data study` (fashion-colour, mixed-20, large-48, textured;
--study-dir). --tiny: a smoke test in seconds on a CPU (small presets, 300 images, fp32).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.bench import describe_device
from benchmarks.make_data import STUDY_SETS
from capsnet import writers
from capsnet.atomic import write_json
from capsnet.cli.args import settings_from_args
from capsnet.cli.main import build_parser
from capsnet.devices import pick_device
from capsnet.training.metrics_log import read_metrics
from capsnet.training.repeat import run_seed
from capsnet.training.settings import TrainSettings

FASHION_GREY_SUBSET = 3000  # Fashion-MNIST grey: a small set like the folder sets
FOLDER_IMAGE_SIZE = {"mixed-20": 32}  # images of mixed sizes, resized
DATASETS = ("mnist", "fashion-mnist", "fashion-grey", *STUDY_SETS)
TINY_OPTIONS = ("--preset", "small", "--subset", "300", "--val-size", "100",
                "--precision", "fp32", "--conv-impl", "gemm")  # and no torch.compile


@dataclass(frozen=True)
class Variant:
    """One row of every table: `capsnet train` options, a note for the study's note column."""

    options: tuple[str, ...] = ()
    note: str = "-"
    epochs: int | None = None  # its own default (None: the study's)


# A table column: its head and its cell from a row (row['eval']: what the study's evaluate
# returned for that run)
Column = tuple[str, Callable[[dict], str]]


@dataclass(frozen=True)
class Study:
    name: str  # the module's name: python -m benchmarks.NAME, NAME.json
    doc: str  # the --help text (before this module's)
    variants: dict[str, Variant]
    default_variants: tuple[str, ...]
    default_datasets: tuple[str, ...]
    targets: Callable[[str], tuple[float, ...]]  # validation accuracies timed, per data set
    epochs: int | None = None  # None: each recipe's own
    tiny_epochs: int = 1
    seed: int = 1
    variant_flag: str = "--variants"  # the option choosing the rows (--models, --recipes)
    note_head: str | None = None  # head of the variants' note column (None: not shown)
    columns: Callable[[str], list[Column]] = lambda dataset: []  # the study's own, per data set
    # (run dir, row, device, measure) -> what the study measured on a complete run, or None
    evaluate: Callable[[Path, dict, torch.device, bool], dict | None] | None = None


def dataset_options(name: str, args: argparse.Namespace) -> list[str]:
    """`capsnet train` options that read data set ``name``."""
    if name == "mnist":
        return ["--dataset", "mnist", *(["--data-dir", args.data_dir] if args.data_dir else [])]
    if name in ("fashion-mnist", "fashion-grey"):
        options = ["--dataset", "fashion-mnist"]
        options += ["--data-dir", args.fashion_dir] if args.fashion_dir else []
        return options + (["--subset", str(FASHION_GREY_SUBSET), "--val-size",
                           str(FASHION_GREY_SUBSET // 10)] if name == "fashion-grey" else [])
    size = FOLDER_IMAGE_SIZE.get(name)
    return ["--dataset", "folder", "--data-dir", str(Path(args.study_dir) / name),
            *(["--image-size", str(size)] if size else [])]


def run_dir(args: argparse.Namespace, dataset: str, variant: str) -> Path:
    return Path(args.out_dir) / dataset / variant


def run_settings(study: Study, args: argparse.Namespace, dataset: str,
                 variant: str) -> tuple[TrainSettings, list[str]]:
    """The run of ``variant`` on ``dataset``: its `capsnet train` options and their settings
    (with --until-target's target and, for --tiny, no torch.compile)."""
    chosen = study.variants[variant]
    epochs = args.epochs or (study.tiny_epochs if args.tiny else chosen.epochs or study.epochs)
    options = [*dataset_options(dataset, args), *chosen.options,
               *(TINY_OPTIONS if args.tiny else ()), "--seed", str(args.seed),
               "--device", args.device, "--out-dir", str(run_dir(args, dataset, variant)),
               "--no-progress", *([] if args.download else ["--no-download"])]
    for flag, value in (("--epochs", epochs), ("--subset", args.subset),
                        ("--precision", args.precision), ("--conv-impl", args.conv_impl)):
        options += [] if value is None else [flag, str(value)]
    if "--model" not in options and "folder" in options:  # the CapsNet, not a folder's auto
        options = ["--model", "capsnet", *options]
    settings = settings_from_args(build_parser().parse_args(["train", *options]))
    return dataclasses.replace(
        settings, compile=settings.compile and not args.tiny,  # a compile takes a minute
        target_accuracy=max(args.targets[dataset]) if args.until_target else None), options


def train(study: Study, args: argparse.Namespace, log) -> None:
    """Start, resume or read back every run, within --time-limit for this call's training."""
    runs = [(f"{dataset}/{variant}", *run_settings(study, args, dataset, variant))
            for dataset in args.datasets for variant in args.variants]
    deadline = None if args.time_limit is None else time.monotonic() + args.time_limit
    for name, settings, options in runs:
        if deadline is not None:
            settings.time_limit = deadline - time.monotonic()
            if settings.time_limit <= 0:
                log(f"{name}: no time left in --time-limit; call again to continue")
                continue
        run_seed(settings, ["train", *options], log)  # command.txt: `capsnet train ...`


def first_reaching(rows: list[dict], target: float) -> dict | None:
    """{'epoch', 'minutes'} of the first epoch whose validation accuracy reaches ``target``,
    minutes summing epoch_seconds up to it; None if none does. ``rows`` are metrics.csv
    rows (an epoch repeated by a resume counts once: its last row)."""
    seconds = 0.0
    for epoch, row in sorted({row["epoch"]: row for row in rows}.items()):
        seconds += row.get("epoch_seconds") or 0.0
        if (row.get("val_accuracy") or -1.0) >= target:
            return {"epoch": epoch, "minutes": round(seconds / 60.0, 2)}
    return None


def read_run(path: Path, targets: tuple[float, ...]) -> dict:
    """A run's figures from its directory (None where it holds none yet)."""
    rows = read_metrics(path) if (path / "metrics.csv").is_file() else []
    epochs = {row["epoch"]: row for row in rows}
    results = json.loads((path / "results.json").read_text()) \
        if (path / "results.json").is_file() else {}
    scored = [(r["val_accuracy"], -e) for e, r in epochs.items()
              if r.get("val_accuracy") is not None]
    best_val, best_epoch = max(scored, default=(None, None))
    tested = results.get("best", results.get("final"))
    speeds = [r["images_per_second"] for r in epochs.values() if r.get("images_per_second")]
    return {"run_dir": str(path), "complete": bool(results.get("complete", bool(results))),
            "epochs": len(epochs), "best_val_accuracy": best_val,
            "best_epoch": None if best_epoch is None else -best_epoch,
            "test_accuracy": None if tested is None else tested["accuracy"],
            "minutes": round(sum(r.get("epoch_seconds") or 0.0 for r in epochs.values()) / 60, 2),
            "train_images_per_second": statistics.median(speeds) if speeds else None,
            "reached": {f"{t:.3f}": first_reaching(rows, t) for t in targets}}


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def format_table(study: Study, dataset: str, rows: list[dict], targets: tuple[float, ...]) -> str:
    """A data set's Markdown table: one row per variant."""
    columns: list[Column] = [
        ("variant", lambda r: r["variant"] + ("" if r["complete"] else " *")),
        *([(study.note_head, lambda r: r["note"])] if study.note_head else []),
        ("test acc", lambda r: percent(r["test_accuracy"])),
        ("best val (epoch)", lambda r: "-" if r["best_epoch"] is None
         else f"{percent(r['best_val_accuracy'])} ({r['best_epoch']})"),
        ("epochs (min)", lambda r: f"{r['epochs']} ({r['minutes']:.1f})" if r["epochs"] else "-"),
        ("train img/s", lambda r: "-" if r["train_images_per_second"] is None
         else f"{r['train_images_per_second']:,.0f}")]
    columns += [(f"val>={100 * t:.1f}%", lambda r, key=f"{t:.3f}": "-" if r["reached"][key] is None
                 else "ep {epoch}, {minutes:.1f} min".format(**r["reached"][key]))
                for t in targets]
    columns += study.columns(dataset)
    return writers.markdown_table([head for head, _ in columns],
                                  [[cell(r) for _, cell in columns] for r in rows])


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(text + "\n")
    os.replace(partial, path)


def report(study: Study, args: argparse.Namespace, device: torch.device) -> dict:
    """Print every data set's table, write them to OUT/<study>.md and the rows to
    OUT/<study>.json; returns the JSON's record."""
    machine = describe_device(device)
    record = {"study": study.name, "machine": machine, "seed": args.seed, "tiny": args.tiny,
              "until_target": args.until_target, "datasets": {}}
    for dataset in args.datasets:
        rows = []
        for variant in args.variants:
            path = run_dir(args, dataset, variant)
            row = {"variant": variant, "note": study.variants[variant].note,
                   **read_run(path, args.targets[dataset])}
            if study.evaluate is not None:
                row["eval"] = study.evaluate(path, row, device, not args.report_only)
            rows.append(row)
        record["datasets"][dataset] = {"targets": list(args.targets[dataset]), "rows": rows}
    text = [f"{study.name}: seed {args.seed}, test accuracy of the validation-selected epoch; "
            f"{machine}"]
    text += [f"### {dataset}\n\n" + format_table(study, dataset, table["rows"], table["targets"])
             for dataset, table in record["datasets"].items()]
    text.append("(* not finished: call again to continue; minutes are training time from "
                "metrics.csv, validation excluded)")
    print("\n" + "\n\n".join(text))
    write_atomic(Path(args.out_dir) / f"{study.name}.md", "\n\n".join(text))
    write_json(Path(args.out_dir) / f"{study.name}.json", record)
    return record


def parse_targets(text: str | None, datasets: list[str],
                  default: Callable[[str], tuple[float, ...]]) -> dict[str, tuple[float, ...]]:
    """--target: comma-separated accuracies, each 'ACC' (every data set) or 'NAME=ACC'
    (that data set); a data set given none keeps its default."""
    given: dict[str, list[float]] = {}
    for item in filter(None, (text or "").split(",")):
        name, _, value = item.rpartition("=")
        for dataset in [name.strip()] if name else datasets:
            given.setdefault(dataset, []).append(float(value))
    return {d: tuple(given.get(d) or default(d)) for d in datasets}


def parse_args(study: Study, argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"python -m benchmarks.{study.name}",
                                description=f"{study.doc}\n{__doc__}",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(study.variant_flag, dest="variants", default=",".join(study.default_variants),
                   help=f"comma-separated, from {', '.join(study.variants)}")
    p.add_argument("--datasets", default=",".join(study.default_datasets),
                   help=f"comma-separated, from {', '.join(DATASETS)}")
    p.add_argument("--epochs", type=int, default=None, help="of every run")
    p.add_argument("--subset", type=int, default=None, help="train on the first N images")
    p.add_argument("--target", default=None,
                   help="validation accuracies to time: ACC or NAME=ACC, comma-separated")
    p.add_argument("--until-target", action="store_true",
                   help="stop each run at the first epoch reaching its highest target")
    p.add_argument("--out-dir", default=f"runs/{study.name.replace('_', '-')}",
                   help="parent of the runs, <data set>/<variant> each")
    p.add_argument("--data-dir", default=None, help="MNIST's directory (default: capsnet's)")
    p.add_argument("--fashion-dir", default=None, help="Fashion-MNIST's directory")
    p.add_argument("--study-dir", default=None, help="where make_data study wrote the sets")
    p.add_argument("--no-download", dest="download", action="store_false")
    p.add_argument("--seed", type=int, default=study.seed)
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda")
    p.add_argument("--precision", default=None, help="as `capsnet train --precision`")
    p.add_argument("--conv-impl", default=None, help="as `capsnet train --conv-impl`")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="stop this call's training before an epoch would overrun SECONDS")
    p.add_argument("--report-only", action="store_true", help="train nothing; print the tables")
    p.add_argument("--tiny", action="store_true", help="a smoke test in seconds on a CPU")
    args = p.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    args.datasets = [d for d in args.datasets.split(",") if d]
    unknown = [v for v in args.variants if v not in study.variants] + [
        d for d in args.datasets if d not in DATASETS]
    if unknown or not args.variants or not args.datasets:
        p.error(f"unknown {unknown}: {study.variant_flag} from {', '.join(study.variants)}; "
                f"--datasets from {', '.join(DATASETS)}")
    if any(d in STUDY_SETS for d in args.datasets) and args.study_dir is None:
        p.error("the folder sets need --study-dir (python -m benchmarks.make_data study)")
    try:
        args.targets = parse_targets(args.target, args.datasets, study.targets)
    except ValueError:
        p.error(f"--target {args.target!r}: ACC or NAME=ACC, comma-separated")
    if not all(0 < t <= 1 for ts in args.targets.values() for t in ts):
        p.error(f"--target {args.target!r}: accuracies are fractions in (0, 1], e.g. 0.99")
    return args


def main(study: Study, argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(study, argv)
    if not args.report_only:
        train(study, args, print)
    report(study, args, pick_device(args.device))
    return 0
