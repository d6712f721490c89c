"""Routing zoo: every capsule model and routing algorithm, and the CNN baseline, trained
under one protocol on each of a list of datasets, one markdown table per dataset.

    PYTHONPATH=. python3 benchmarks/routing_zoo.py --data-dir ~/mnist --out-dir runs/zoo \\
        --datasets mnist,fashion-mnist
    python3 benchmarks/make_study_sets.py --out /tmp/study --sets fashion-colour
    PYTHONPATH=. python3 benchmarks/routing_zoo.py --datasets fashion-colour --study-dir /tmp/study

The protocol: the same seed, validation split (capsnet's default: 5,000 MNIST images, a
tenth of a smaller pool), number of epochs (--epochs, default 10; --until-target stops a run
at the first epoch whose validation accuracy reaches --target) for every model; the epoch
is selected by validation accuracy and the test set is evaluated once. Each model keeps its
own recipe otherwise (batch size, learning rate, schedule, augmentation: Efficient-CapsNet
its authors' recipe, the EM model spread loss and Adam at 3e-3, the CNN Adam at 1e-4).
Rows (--models): capsnet (dynamic routing), capsnet-inverted-attention,
capsnet-self-attention (the paper's CapsNet with another router), efficient
(Efficient-CapsNet), em (matrix capsules with EM routing, small preset, 2 iterations), cnn
(the paper's baseline CNN); em-3 (the same with the paper's 3 iterations) and cnn-tiny (the
plain small CNN of benchmarks/own_data_study.py) on request.
Datasets (--datasets): mnist (--data-dir), fashion-mnist (--fashion-dir, default: the usual
lookup, Debian's /usr/share/datasets/fashion-mnist included) and the colour folder sets of
benchmarks/make_study_sets.py (fashion-colour, mixed-20, large-48, textured; --study-dir).

Every run trains through `capsnet train`'s library call (capsnet.training.repeat.run_seed)
in --out-dir/<dataset>/<model>: calling again reads a complete run back and resumes a
stopped one from its last.pt (--time-limit stops this call's training resumably). A table
row: test accuracy of the selected epoch; parameters; training images/s (the median over
epochs of metrics.csv's images_per_second); inference images/s (the median of a few timed
forward passes over test batches, the model under its inference speed plan, measured once
after training and kept in zoo_eval.json beside the run); epochs trained and training
minutes; the first epoch reaching --target and the training minutes up to it; on MNIST the
accuracy on the seeded affine set of `capsnet robustness` (capsnet.experiments.robustness).
Written with the machine's description to --out-dir/routing_zoo.json. A figure missing
(a run not finished, a measurement not taken) is printed as '-', never guessed.

--tiny runs everything in seconds on a CPU (small presets, 300 images, 1 epoch, fp32): a
smoke test of the machinery, not a measurement.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.make_study_sets import STUDY_SETS  # noqa: E402
from benchmarks.time_to_accuracy import machine_line, run_row  # noqa: E402
from capsnet.data.model_view import load_test_set  # noqa: E402
from capsnet.data.transforms import AffineRanges  # noqa: E402
from capsnet.devices import pick_device, synchronize  # noqa: E402
from capsnet.experiments import TEST_SEED  # noqa: E402
from capsnet.experiments.robustness import NamedModel, affine_rows  # noqa: E402
from capsnet.inference import image_batch  # noqa: E402
from capsnet.loading import model_from_checkpoint  # noqa: E402
from capsnet.models import count_parameters  # noqa: E402
from capsnet.training.metrics_log import read_metrics  # noqa: E402
from capsnet.training.repeat import run_seed  # noqa: E402
from capsnet.training.settings import TrainSettings  # noqa: E402
from capsnet.tuning import tune_for_inference  # noqa: E402


@dataclass(frozen=True)
class ZooModel:
    """One row of the tables: the model, its preset and (CapsNet) its router."""

    model: str
    routing: str  # as the table names it (the router the model holds)
    preset: str = "paper"
    # torch.compile the training step: EM routing's many passes over the votes fuse, which
    # doubled the small EM model's training speed (docs/models-em.md, "Speed and memory")
    compile: bool = False
    routing_iterations: int | None = None  # None: the model's default

    def settings(self) -> dict:
        values = {"model": self.model, "preset": self.preset, "compile": self.compile}
        if self.routing_iterations is not None:
            values["routing_iterations"] = self.routing_iterations
        return values | ({"routing": self.routing} if self.model == "capsnet" else {})


ZOO = {
    "capsnet": ZooModel("capsnet", "dynamic"),
    "capsnet-inverted-attention": ZooModel("capsnet", "inverted-attention"),
    "capsnet-self-attention": ZooModel("capsnet", "self-attention"),
    "efficient": ZooModel("efficient", "self-attention"),
    # two EM iterations: with the paper's three the model learns several times more slowly
    # on MNIST (docs/models-em.md, "Two iterations or three"); em-3 is the paper's count
    "em": ZooModel("em", "em, 2 iterations", preset="small", compile=True,
                   routing_iterations=2),
    "em-3": ZooModel("em", "em, 3 iterations", preset="small", compile=True,
                     routing_iterations=3),
    "cnn": ZooModel("cnn", "-"),
    "cnn-tiny": ZooModel("cnn", "-", preset="tiny"),
}
DEFAULT_MODELS = ("capsnet", "capsnet-inverted-attention", "capsnet-self-attention",
                  "efficient", "em", "cnn")
IDX_SETS = ("mnist", "fashion-mnist")
DEFAULT_DATASETS = ("mnist", "fashion-mnist", "fashion-colour")
FOLDER_IMAGE_SIZE = {"mixed-20": 32}  # images of mixed sizes: resized, as own_data_study does
EPOCHS = 10
# Validation accuracy to time per dataset (--target overrides): MNIST's 99% as in
# benchmarks/time_to_accuracy.py; thresholds, not results.
TARGETS = {"mnist": 0.99, "fashion-mnist": 0.90}
FOLDER_TARGET = 0.80
TINY = {"preset": "small", "subset": 300, "val_size": 100, "precision": "fp32",
        "conv_impl": "gemm", "compile": False}  # a compile takes a minute
TINY_EPOCHS = 1
INFER_BATCH = 256  # images per timed forward pass
INFER_BATCHES = 5  # timed passes (after one warm-up); their median counts
EVAL_FILE = "zoo_eval.json"


def dataset_settings(name: str, args: argparse.Namespace) -> dict:
    """TrainSettings fields that read dataset ``name``."""
    if name == "mnist":
        return {"dataset": "mnist", "data_dir": args.data_dir}
    if name == "fashion-mnist":
        return {"dataset": "fashion-mnist", "data_dir": args.fashion_dir}
    return {"dataset": "folder", "data_dir": str(Path(args.study_dir) / name),
            "image_size": FOLDER_IMAGE_SIZE.get(name)}


def run_dir(args: argparse.Namespace, dataset: str, key: str) -> Path:
    return Path(args.out_dir) / dataset / key


def run_settings(args: argparse.Namespace, dataset: str, key: str) -> TrainSettings:
    """The run of model ``key`` on ``dataset`` under the zoo's protocol."""
    values = dict(**ZOO[key].settings(), **dataset_settings(dataset, args), seed=args.seed,
                  download=args.download, device=args.device, progress=False,
                  out_dir=str(run_dir(args, dataset, key)), epochs=args.epochs,
                  precision=args.precision, conv_impl=args.conv_impl)
    if args.tiny:
        values.update(TINY)
    if args.subset is not None:
        values["subset"] = args.subset
    if args.until_target:
        values["target_accuracy"] = args.targets[dataset]
    return TrainSettings(**values)


@torch.no_grad()
def inference_speed(model: torch.nn.Module, images: torch.Tensor, device: torch.device,
                    batch: int = INFER_BATCH, batches: int = INFER_BATCHES) -> dict:
    """Images/s of ``model``'s forward pass on uint8 ``images``: the median of ``batches``
    timed passes of ``batch`` images (fewer when the set is small), after one warm-up."""
    batch = min(batch, len(images))
    count = max(1, min(batches, len(images) // batch))
    inputs = [image_batch(images[k * batch:(k + 1) * batch], device) for k in range(count)]
    model(inputs[0])  # warm-up: kernels chosen, memory allocated
    seconds = []
    for x in inputs:
        synchronize(device)
        start = time.perf_counter()
        model(x)
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    return {"images_per_second": round(batch / statistics.median(seconds), 1),
            "batch": batch, "batches": count}


def measured(run: Path, results: dict) -> bool:
    """Whether the run's zoo_eval.json measured the model ``results`` selected (a run
    trained on for more epochs may have selected another)."""
    path = run / EVAL_FILE
    if not path.is_file():
        return False
    record = json.loads(path.read_text())
    return [record.get("epochs"), record.get("best_epoch")] == [results.get("epochs"),
                                                                  results.get("best_epoch")]


def measure_run(settings: TrainSettings, key: str, results: dict,
                device: torch.device) -> dict:
    """Parameters, inference speed and (MNIST) affine-set accuracy of the run's selected
    model, written to its zoo_eval.json."""
    out = Path(settings.out_dir)
    checkpoint = out / "best.pt" if (out / "best.pt").is_file() else out / "last.pt"
    model = model_from_checkpoint(checkpoint, map_location=device).eval()
    plan = tune_for_inference(model, device, settings.precision, settings.conv_impl)
    test = load_test_set(model.config, settings.dataset, settings.data_dir, settings.download,
                         progress=False).to(device)
    record = {"checkpoint": checkpoint.name, "epochs": results.get("epochs"),
              "best_epoch": results.get("best_epoch"), "machine": machine_line(device),
              "parameters": count_parameters(model), "speed_plan": plan.describe(),
              "inference": inference_speed(model, test.images, device), "affine": None}
    if settings.dataset == "mnist":
        [row] = affine_rows([NamedModel(key, model)], test.images, test.labels, AffineRanges(),
                            seed=TEST_SEED)
        record["affine"] = {"accuracy": row["accuracy"], "images": row["images"],
                            "seed": TEST_SEED, "ranges": AffineRanges().describe()}
    (out / EVAL_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record


def train_and_measure(args: argparse.Namespace, argv: list[str], device: torch.device,
                      log) -> None:
    """Start, resume or read back every run, then measure each complete one not measured
    yet; --time-limit bounds this call's training."""
    deadline = None if args.time_limit is None else time.monotonic() + args.time_limit
    for dataset in args.datasets:
        for key in args.models:
            settings = run_settings(args, dataset, key)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    log(f"{dataset}/{key}: no time left in --time-limit; call again to continue")
                    continue
                settings.time_limit = left
            results = run_seed(settings, argv, log)
            if results.get("complete", True) and not measured(Path(settings.out_dir), results):
                log(f"{dataset}/{key}: measuring inference speed"
                    + (" and the affine set" if dataset == "mnist" else ""))
                measure_run(settings, key, results, device)


def zoo_row(args: argparse.Namespace, dataset: str, key: str) -> dict:
    """One model's line of a dataset's table, read from its run directory (what is not
    there yet stays None: a dash in the table)."""
    out = run_dir(args, dataset, key)
    target = args.targets[dataset]
    row = run_row(key, out, (target,))
    row["model"] = row.pop("recipe")
    row["routing"] = ZOO[key].routing
    metrics = read_metrics(out) if (out / "metrics.csv").is_file() else []
    speeds = list({r["epoch"]: r.get("images_per_second") for r in metrics}.values())
    speeds = [s for s in speeds if s is not None]
    row["train_images_per_second"] = statistics.median(speeds) if speeds else None
    row["target"] = target
    row["to_target"] = row.pop("reached")[f"{target:.3f}"]  # first_reaching's
    results = out / "results.json"
    results = json.loads(results.read_text()) if results.is_file() else {}
    row["eval"] = json.loads((out / EVAL_FILE).read_text()) if measured(out, results) else None
    return row


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def format_table(rows: list[dict], dataset: str) -> str:
    """A dataset's markdown table (affine-set accuracy for MNIST)."""
    target = rows[0]["target"]
    head = ["model", "routing", "test acc", "parameters", "train img/s", "infer img/s",
            "epochs (min)", f"val>={100 * target:.1f}%"]
    affine = dataset == "mnist"
    head += ["affine set"] if affine else []
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        evaluated = row["eval"] or {}
        hit = row["to_target"]
        cells = [row["model"] + ("" if row["complete"] else " *"), row["routing"],
                 _percent(None if row["test_error"] is None else 1 - row["test_error"]),
                 f"{evaluated['parameters']:,}" if evaluated else "-",
                 "-" if row["train_images_per_second"] is None
                 else f"{row['train_images_per_second']:,.0f}",
                 f"{evaluated['inference']['images_per_second']:,.0f}" if evaluated else "-",
                 f"{row['epochs']} ({row['minutes']:.1f})" if row["epochs"] else "-",
                 "-" if hit is None else f"ep {hit['epoch']}, {hit['minutes']:.1f} min"]
        if affine:
            cells.append(_percent((evaluated.get("affine") or {}).get("accuracy")))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_targets(text: str | None, datasets: list[str]) -> dict[str, float]:
    """--target: one accuracy for every dataset, or 'name=accuracy,...' (others keep
    their default)."""
    targets = {d: TARGETS.get(d, FOLDER_TARGET) for d in datasets}
    if text is None:
        return targets
    if "=" not in text:
        return dict.fromkeys(datasets, float(text))
    for part in filter(None, text.split(",")):
        name, value = part.split("=", 1)
        targets[name.strip()] = float(value)
    return targets


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help=f"comma-separated, from {', '.join(ZOO)}")
    p.add_argument("--datasets", default=",".join(DEFAULT_DATASETS),
                   help=f"comma-separated, from {', '.join((*IDX_SETS, *STUDY_SETS))}")
    p.add_argument("--epochs", type=int, default=None,
                   help=f"of every run (default {EPOCHS}; {TINY_EPOCHS} with --tiny)")
    p.add_argument("--subset", type=int, default=None,
                   help="train on the first N images of each training pool")
    p.add_argument("--target", default=None,
                   help="validation accuracy to time: one for all, or NAME=ACC,... (default "
                        "mnist 0.99, fashion-mnist 0.90, folder sets 0.80)")
    p.add_argument("--until-target", action="store_true",
                   help="stop each run at the first epoch reaching its --target")
    p.add_argument("--out-dir", default="runs/routing-zoo",
                   help="parent of the runs, <dataset>/<model> each")
    p.add_argument("--data-dir", default=None, help="MNIST's directory (default: capsnet's)")
    p.add_argument("--fashion-dir", default=None,
                   help="Fashion-MNIST's directory (default: the usual lookup)")
    p.add_argument("--study-dir", default=None,
                   help="where benchmarks/make_study_sets.py wrote the folder sets")
    p.add_argument("--no-download", dest="download", action="store_false")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cpu, cuda")
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16"),
                   help="as `capsnet train --precision` (auto: measured)")
    p.add_argument("--conv-impl", default="auto",
                   choices=("auto", "gemm", "native", "channels_last"),
                   help="as `capsnet train --conv-impl` (auto: measured)")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="stop this call's training before an epoch would overrun SECONDS "
                        "(resumable: call again)")
    p.add_argument("--report-only", action="store_true",
                   help="train and measure nothing; print the tables")
    p.add_argument("--tiny", action="store_true",
                   help="a smoke test in seconds on a CPU: small presets, 300 images, 1 epoch")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.datasets = [d for d in args.datasets.split(",") if d]
    unknown = [m for m in args.models if m not in ZOO] + [
        d for d in args.datasets if d not in (*IDX_SETS, *STUDY_SETS)]
    if unknown or not args.models or not args.datasets:
        p.error(f"--models from {', '.join(ZOO)} and --datasets from "
                f"{', '.join((*IDX_SETS, *STUDY_SETS))} (not {unknown})")
    if any(d in STUDY_SETS for d in args.datasets) and args.study_dir is None:
        p.error("the folder sets need --study-dir (benchmarks/make_study_sets.py writes them)")
    try:
        args.targets = parse_targets(args.target, args.datasets)
    except ValueError:
        p.error(f"--target {args.target!r}: a number or NAME=NUMBER,...")
    if not all(0 < t <= 1 for t in args.targets.values()):
        p.error(f"--target {args.target!r}: accuracies are fractions in (0, 1], e.g. 0.99")
    if args.epochs is None:
        args.epochs = TINY_EPOCHS if args.tiny else EPOCHS
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    device = pick_device(args.device)
    if not args.report_only:
        train_and_measure(args, argv, device, print)
    machine = machine_line(device)
    report = {"machine": machine, "seed": args.seed, "epochs": args.epochs,
              "until_target": args.until_target, "tiny": args.tiny, "datasets": {}}
    epochs = f"{args.epochs} epoch" + ("s" if args.epochs != 1 else "")
    print(f"\nrouting zoo: seed {args.seed}, {epochs}"
          + (" or until the target" if args.until_target else "")
          + f", test accuracy of the validation-selected epoch; {machine}")
    for dataset in args.datasets:
        rows = [zoo_row(args, dataset, key) for key in args.models]
        report["datasets"][dataset] = rows
        print(f"\n### {dataset}\n\n{format_table(rows, dataset)}")
    print("\n(* not finished: call again to continue; minutes are training time from "
          "metrics.csv, validation excluded; each run's own machine is in its zoo_eval.json)")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "routing_zoo.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
