"""Routing zoo: every capsule model and routing algorithm, and the CNN baseline, trained under
one protocol on each of a list of data sets, one Markdown table per data set.

    python -m benchmarks.routing_zoo --data-dir ~/mnist --out-dir runs/zoo \\
        --datasets mnist,fashion-mnist
    python -m benchmarks.make_data study --out /tmp/study --sets fashion-colour
    python -m benchmarks.routing_zoo --datasets fashion-colour --study-dir /tmp/study

The same seed, validation split and epochs (--epochs, default 10; --until-target stops a run
at its --target) for every model; each keeps its own recipe otherwise (Efficient-CapsNet its
authors', the EM model spread loss and Adam at 3e-3, the CNN Adam at 1e-4). Rows (--models):
capsnet (dynamic routing), capsnet-inverted-attention, capsnet-self-attention (the paper's
CapsNet with another router), efficient (Efficient-CapsNet), em (matrix capsules with EM
routing, small preset, 2 iterations), cnn (the paper's baseline CNN); em-3 (the paper's 3
iterations) and cnn-tiny on request. Targets: MNIST 99%, Fashion-MNIST 90%, folder sets 80%.
Besides benchmarks.sweep's columns: parameters, inference images/s (the median of a few
timed forward passes over test batches, the model under its inference speed plan) and on
MNIST the accuracy on the seeded affine set of `capsnet robustness`, measured once on the
selected model and kept in zoo_eval.json beside the run.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

from benchmarks import sweep
from benchmarks.bench import describe_device, wall_clock
from benchmarks.sweep import Column, Study, Variant, percent
from capsnet.atomic import write_json
from capsnet.checkpoint import model_from_checkpoint
from capsnet.data.model_view import load_test_set
from capsnet.data.transforms import AffineRanges
from capsnet.experiments import TEST_SEED
from capsnet.experiments.robustness import NamedModel, affine_rows
from capsnet.inference import image_batch
from capsnet.models import count_parameters
from capsnet.training.settings import TrainSettings
from capsnet.tuning import tune_for_inference

# torch.compile for EM: its routing's many passes over the votes fuse, which doubled the
# small model's training speed; two iterations: with the paper's three it learns several
# times more slowly on MNIST (docs/models-em.md)
EM = ("--model", "em", "--preset", "small", "--compile", "--routing-iterations")
ZOO = {
    "capsnet": Variant(("--routing", "dynamic"), "dynamic"),
    "capsnet-inverted-attention": Variant(("--routing", "inverted-attention"),
                                          "inverted-attention"),
    "capsnet-self-attention": Variant(("--routing", "self-attention"), "self-attention"),
    "efficient": Variant(("--model", "efficient"), "self-attention"),
    "em": Variant((*EM, "2"), "em, 2 iterations"),
    "em-3": Variant((*EM, "3"), "em, 3 iterations"),
    "cnn": Variant(("--model", "cnn"), "-"),
    "cnn-tiny": Variant(("--model", "cnn", "--preset", "tiny"), "-"),
}
TARGETS = {"mnist": 0.99, "fashion-mnist": 0.90}  # thresholds, not results
FOLDER_TARGET = 0.80
INFER_BATCH = 256  # images per timed forward pass
INFER_BATCHES = 5  # timed passes (after one warm-up); their median counts
EVAL_FILE = "zoo_eval.json"


@torch.no_grad()
def inference_speed(model: torch.nn.Module, images: torch.Tensor, device: torch.device) -> dict:
    """Images/s of ``model``'s forward pass on uint8 ``images``: the median of INFER_BATCHES
    timed passes of INFER_BATCH images (fewer when the set is small), after one warm-up."""
    batch = min(INFER_BATCH, len(images))
    count = max(1, min(INFER_BATCHES, len(images) // batch))
    inputs = [image_batch(images[k * batch:(k + 1) * batch], device) for k in range(count)]
    model(inputs[0])  # warm-up: kernels chosen, memory allocated
    seconds = [wall_clock(lambda x=x: model(x), device, inner=1) for x in inputs]
    return {"images_per_second": round(batch / statistics.median(seconds), 1),
            "batch": batch, "batches": count}


def evaluate(run: Path, row: dict, device: torch.device, measure: bool) -> dict | None:
    """Parameters, inference speed and (MNIST) affine-set accuracy of the run's selected
    model: read from its zoo_eval.json when that measured this selection, else measured
    (``measure``, complete runs only) and written there."""
    path = run / EVAL_FILE
    record = json.loads(path.read_text()) if path.is_file() else {}
    if [record.get("epochs"), record.get("best_epoch")] == [row["epochs"], row["best_epoch"]]:
        return record
    if not (measure and row["complete"]):
        return None
    settings = TrainSettings.from_dict(json.loads((run / "config.json").read_text())["settings"])
    checkpoint = run / "best.pt" if (run / "best.pt").is_file() else run / "last.pt"
    model = model_from_checkpoint(checkpoint, map_location=device).eval()
    plan = tune_for_inference(model, device, settings.precision, settings.conv_impl)
    test = load_test_set(model.config, settings.dataset, settings.data_dir, settings.download,
                         progress=False).to(device)
    print(f"{run}: measuring inference speed"
          + (" and the affine set" if settings.dataset == "mnist" else ""))
    record = {"checkpoint": checkpoint.name, "epochs": row["epochs"],
              "best_epoch": row["best_epoch"], "machine": describe_device(device),
              "parameters": count_parameters(model), "speed_plan": plan.describe(),
              "inference": inference_speed(model, test.images, device), "affine": None}
    if settings.dataset == "mnist":
        [affine] = affine_rows([NamedModel(run.name, model)], test.images, test.labels,
                               AffineRanges(), seed=TEST_SEED)
        record["affine"] = {"accuracy": affine["accuracy"], "images": affine["images"],
                            "seed": TEST_SEED, "ranges": AffineRanges().describe()}
    write_json(path, record)
    return record


def measured(head: str, cell) -> Column:
    return head, lambda row: "-" if row["eval"] is None else cell(row["eval"])


def columns(dataset: str) -> list[Column]:
    own = [measured("parameters", lambda e: f"{e['parameters']:,}"),
           measured("infer img/s", lambda e: f"{e['inference']['images_per_second']:,.0f}")]
    return own + ([measured("affine set", lambda e: percent(e["affine"]["accuracy"]))]
                  if dataset == "mnist" else [])


STUDY = Study(
    name="routing_zoo", doc=__doc__, variants=ZOO,
    default_variants=("capsnet", "capsnet-inverted-attention", "capsnet-self-attention",
                      "efficient", "em", "cnn"),
    default_datasets=("mnist", "fashion-mnist", "fashion-colour"),
    targets=lambda dataset: (TARGETS.get(dataset, FOLDER_TARGET),), epochs=10,
    variant_flag="--models", note_head="routing", columns=columns, evaluate=evaluate)


def main(argv: list[str] | None = None) -> int:
    return sweep.main(STUDY, argv)


if __name__ == "__main__":
    sys.exit(main())
