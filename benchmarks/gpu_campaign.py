"""The paper's numbers from a lent GPU, stage by stage, each call within a time budget.

    PYTHONPATH=. python3 benchmarks/gpu_campaign.py STAGE --data-dir .gpu-data/mnist --out $OUT

Every call first checks the machine, in well under a minute (-> health.json): the device,
its compute capability, torch/CUDA/cuDNN versions and native 16-bit precisions, the speed
plan chosen for the paper CapsNet at batch 128, one timed training step, and the memory
estimate against the peak the step allocated.

Stages (each resumable: call it again and it continues from --work; done runs are skipped):

  bench       training-step and inference speed at batch 128 (benchmarks/bench.py): the
              references, fp32 and the native 16-bit precision on each convolution path,
              the rule's plan ('capsnet'), torch.compile and (GPU) CUDA graphs; peak
              memory (GPU); and two full MNIST training epochs (55,000 images, batch 128)
              with the default plan, by `fit`: the second is the one reported (the first
              pays for cuDNN's autotuning and the allocator's growth; goal: under 10 s on
              an H100).                                                        -> bench.json
  paper       the paper's recipe (3 routing iterations, reconstruction 0.0005, 2-pixel
              shifts, Adam, exponential decay), --epochs per seed, once per --seed as
              `capsnet repeat` does (each seed selected by validation, tested once at its
              end); mean ± std and the ensemble once every seed is done.
                                                 -> paper.json, paper-capsnet.safetensors
  cnn         the paper's 35.4M-parameter CNN baseline, the same recipe, the first seed.
                                                 -> cnn.json (its 71 MB of weights stay in --work)
  affnist     paper-size CapsNet and CNN trained on MNIST placed on 40x40 until validation
              accuracy reaches 0.992 (at most --epochs), then compared on placed MNIST and
              the affine test set.                                             -> affnist.json
  multimnist  paper-size CapsNet on MultiMNIST (shifts of up to 4 px), trained as far as
              the budget allows and tested where it stands (a later call trains on and tests
              again).                                                          -> multimnist.json
  all         the stages in this order (the default); each gets the rest of the budget, or
              at most --stage-minutes.

Every call appends its printed output to campaign.log in --out. A run's epochs stop before
one would overrun the budget (TrainSettings.time_limit, with a margin for the test); the run
is then incomplete and the next call resumes it. --finish tests incomplete runs where they
stand (for the last call when device time runs out). --tiny runs every stage in seconds on
a CPU (small preset, a few hundred images, 1 epoch, tiny test sets): a smoke test.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
import traceback
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import bench  # noqa: E402
from benchmarks.campaign_health import health_check, print_health  # noqa: E402
from benchmarks.campaign_runs import (  # noqa: E402
    Budget,
    RunSpec,
    advance,
    export_selected,
    read_results,
    run_summary,
)
from capsnet.data.datasets import load_split  # noqa: E402
from capsnet.devices import pick_device  # noqa: E402
from capsnet.experiments.affnist import compare, format_comparison, train_affnist  # noqa: E402
from capsnet.experiments.matching import matched_checkpoints  # noqa: E402
from capsnet.experiments.multimnist_training import train_multimnist  # noqa: E402
from capsnet.experiments.robustness import NamedModel  # noqa: E402
from capsnet.loading import load_model  # noqa: E402
from capsnet.training.fit import fit  # noqa: E402
from capsnet.training.metrics_log import read_metrics  # noqa: E402
from capsnet.training.repeat import summarise  # noqa: E402
from capsnet.training.settings import TrainSettings  # noqa: E402
from capsnet.tuning import tune_for_inference  # noqa: E402

STAGES = ("bench", "paper", "cnn", "affnist", "multimnist")
EPOCHS = 50
GOAL_EPOCH_SECONDS = 10.0  # one MNIST training epoch on an H100
GOAL_WORDS = {True: "met", False: "not met", None: "not judged (--tiny)"}
AFFNIST_TARGET = 0.992  # the paper trains both models to about 99.2% on placed MNIST
MULTIMNIST_SHIFT = 4
# --tiny: every stage in seconds on a CPU
TINY = {"preset": "small", "subset": 300, "val_size": 100, "precision": "fp32",
        "conv_impl": "gemm"}
TINY_TEST = 100  # test digits (affNIST) and test pairs (MultiMNIST)
TINY_BENCH_CASES = ("capsnet", "capsnet-fp32-gemm", "capsnet-bf16-gemm")
COMPILE_CASE = "capsnet-compile"
# seconds, on a GPU: a run's setup before its first epoch, its test at the end, an epoch no
# run has measured yet, and the parts of `bench`
MARGINS = {"setup": 30.0, "final": 30.0, "unknown_epoch": 60.0}
BENCH_PARTS = {"cases": 240.0, "epoch": 90.0, "memory": 90.0, "cuda_graphs": 150.0}
HEALTH_BATCH = 128  # the paper's batch; --tiny: TINY_HEALTH_BATCH
TINY_HEALTH_BATCH = 4
HEALTH_STEPS = 3  # timed training steps after one warm-up step


@dataclass
class Campaign:
    """What every stage is given: the options, the device, the directories."""

    args: Namespace
    device: torch.device
    work: Path
    out: Path
    argv: list[str]

    @property
    def tiny(self) -> bool:
        return self.args.tiny

    @property
    def run_argv(self) -> list[str]:
        """The command line that run directories record (command.txt)."""
        return ["benchmarks/gpu_campaign.py", *self.argv]

    @property
    def seeds(self) -> list[int]:
        return [int(s) for s in self.args.seeds.split(",") if s.strip()]

    def settings(self, **values) -> TrainSettings:
        """The paper recipe's settings (``TINY``'s under --tiny) with ``values`` on top."""
        base = {"preset": "paper", "data_dir": self.args.data_dir, "download": False,
                "epochs": self.args.epochs, "device": self.args.device,
                "compile": self.args.compile, "progress": False}
        return TrainSettings(**{**base, **(TINY if self.tiny else {}), **values})

    def has_time(self, budget: Budget, part: str) -> bool:
        return self.tiny or budget.left() >= BENCH_PARTS[part]

    def write(self, stage: str, record: dict, started: float) -> dict:
        """``record`` with what ran where, as --out/<stage>.json."""
        record = {"stage": stage, "device": bench.describe_device(self.device),
                  "torch": torch.__version__, "tiny": self.tiny,
                  "command": " ".join(self.run_argv),
                  "written": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "seconds_this_call": round(time.monotonic() - started, 1), **record}
        (self.out / f"{stage}.json").write_text(json.dumps(record, indent=2) + "\n")
        return record


def pct(value) -> str:
    return "-" if value is None else f"{100 * value:.2f}%"


def describe_run(run: dict) -> str:
    """One line per run for the printed summary."""
    parts = [f"{run['label']}: epochs {run['epochs_done']}/{run['epochs_target']}",
             f"best val {pct(run['best_val_accuracy'])} (epoch {run['best_epoch']})"]
    if run["mean_epoch_seconds"] is not None:
        parts.append(f"{run['mean_epoch_seconds']:.1f} s/epoch")
    test = run.get("test", {})
    if "best" in test or "final" in test:  # the recipe: the validation-selected epoch
        parts.append(f"test {pct(test.get('best', test.get('final'))['accuracy'])}")
    elif "mnist_accuracy" in test:  # affNIST
        parts.append(f"test {pct(test['mnist_accuracy'])} placed, "
                     f"{pct(test['affine_accuracy'])} affine")
    elif "error" in test:  # MultiMNIST
        parts.append(f"test error {pct(test['error'])} ({test['pairs']} pairs)")
    parts.append("complete" if run["complete"] else "incomplete")
    return "  " + ", ".join(parts)


# ---------------------------------------------------------------------------- bench


def stage_bench(c: Campaign, budget: Budget) -> dict:
    """Speed cases, one full training epoch, peak memory and CUDA graphs, each part once."""
    started, work = time.monotonic(), c.work / "bench"
    work.mkdir(parents=True, exist_ok=True)
    saved = work / "bench.json"
    record = json.loads(saved.read_text()) if saved.is_file() else {}
    gpu = c.device.type == "cuda"
    parts = {"cases": lambda: bench_cases(c, work, budget, record),
             "epoch": lambda: bench_epoch(c, work / "epoch"),
             "memory": lambda: bench_memory(c, record["cases"]),
             "cuda_graphs": lambda: bench_cuda_graphs(c) if gpu
             else {"skipped": "CUDA graphs need a GPU", "helpful": None}}
    for name, measure in parts.items():
        if name in record:
            print(f"bench: {name} measured in an earlier call (skipped)")
        elif name == "memory" and gpu and "cases" not in record:
            print("bench: memory waits for the cases (next call)")
        elif c.has_time(budget, name):
            result = measure()
            if result is not None:  # None: left for the next call (budget)
                record[name] = result
            saved.write_text(json.dumps(record, indent=2) + "\n")
        else:
            print(f"bench: {name} left for the next call (budget)")
    record["complete"] = all(name in record for name in parts)
    record["goal"] = (f"one training epoch of the paper CapsNet on 55,000 MNIST images at "
                      f"batch 128 in under {GOAL_EPOCH_SECONDS:.0f} s on an H100")
    print_bench(record)
    return c.write("bench", record, started)


def bench_cases(c: Campaign, work: Path, budget: Budget, record: dict) -> dict | None:
    """benchmarks/bench.py's cases on this device, interleaved, as its --json writes them.
    Should torch.compile fail, its error is recorded and the others run again without it
    when the budget still has room for them (None: not now; the next call runs them,
    without the compiled case)."""
    cases = list(TINY_BENCH_CASES if c.tiny else bench.cases_for(c.device))
    if "compile_error" in record:
        cases = [case for case in cases if case != COMPILE_CASE]
    size = ["--batch-size", "2", "--warmup", "0", "--repeats", "1"] if c.tiny else \
        ["--batch-size", "128", "--warmup", "3", "--repeats", "20"]
    path = work / "cases.json"

    def run(cases: list[str]) -> dict:
        bench.main(["--device", str(c.device), *size, "--cases", ",".join(cases),
                    "--json", str(path)])
        return json.loads(path.read_text())

    if COMPILE_CASE not in cases:
        return {**run(cases), **({"compile_error": record["compile_error"]}
                                 if "compile_error" in record else {})}
    try:
        return run(cases)
    except Exception as exc:  # torch.compile needs a working Triton; the rest does not
        record["compile_error"] = f"{type(exc).__name__}: {exc}"[:2000]
        print(f"bench: {COMPILE_CASE} failed ({type(exc).__name__}: {exc})")
        if not c.has_time(budget, "cases"):
            print("bench: the cases without it are left for the next call (budget)")
            return None
        print("bench: the cases again without it")
        return {**run([case for case in cases if case != COMPILE_CASE]),
                "compile_error": record["compile_error"]}


def bench_epoch(c: Campaign, run_dir: Path) -> dict:
    """Two training epochs with the default plan, by `fit` on a fresh run directory; the
    second is reported (the first pays for cuDNN's autotuning and the allocator's growth)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    settings = c.settings(epochs=2, seed=c.seeds[0], out_dir=str(run_dir))
    start = time.perf_counter()
    results = fit(settings, argv=c.run_argv)
    rows = read_metrics(run_dir)
    first, row = rows[0], rows[-1]
    speed = json.loads((run_dir / "config.json").read_text())["speed"]
    return {"images": round(row["images_per_second"] * row["epoch_seconds"]),
            "batch_size": settings.batch_size, "epoch": row["epoch"],
            "epoch_seconds": row["epoch_seconds"], "images_per_second": row["images_per_second"],
            "first_epoch_seconds": first["epoch_seconds"],
            "fit_seconds": round(time.perf_counter() - start, 1),
            "plan": {"precision": speed["precision"], "conv_impls": speed["conv_impls"],
                     "source": speed["source"]},
            "val_accuracy": row.get("val_accuracy"), "test_accuracy":
            results["final"]["accuracy"],
            "under_goal": None if c.tiny else row["epoch_seconds"] < GOAL_EPOCH_SECONDS}


def bench_memory(c: Campaign, cases: dict) -> dict:
    """Peak memory in MB of each case (GPU: max allocated; CPU: peak resident set), each
    timed in a process of its own by bench.py."""
    return {case: round(r["peak_mb"], 1) for case, r in cases["cases"].items()
            if "peak_mb" in r}


def bench_cuda_graphs(c: Campaign) -> dict:
    """The rule's plan compiled with CUDA graphs against it uncompiled, one run."""
    try:
        timed = bench.time_cases(["capsnet", "capsnet-cudagraphs"],
                                 Namespace(batch_size=128, warmup=3, repeats=20), c.device)
    except Exception as exc:  # recorded: the other parts stand
        return {"error": f"{type(exc).__name__}: {exc}"[:2000], "helpful": False}
    ratio = (timed["capsnet-cudagraphs"]["train_images_per_s"]
             / timed["capsnet"]["train_images_per_s"])
    return {"cases": timed, "train_speedup": round(ratio, 3), "helpful": ratio > 1.05}


def print_bench(record: dict) -> None:
    print("== bench ==")
    for case, r in record.get("cases", {}).get("cases", {}).items():
        print(f"  {case:<28} train {r['train_images_per_s']:9.1f} img/s   "
              f"infer {r['infer_images_per_s']:9.1f} img/s")
    epoch = record.get("epoch")
    if epoch:
        print(f"  training epoch {epoch.get('epoch', 1)}: {epoch['images']} images in "
              f"{epoch['epoch_seconds']:.1f} s ({epoch['images_per_second']:.0f} img/s, plan "
              f"{epoch['plan']['precision']}; the first took "
              f"{epoch.get('first_epoch_seconds', epoch['epoch_seconds']):.1f} s); "
              f"goal under {GOAL_EPOCH_SECONDS:.0f} s: {GOAL_WORDS[epoch['under_goal']]}")
    graphs = record.get("cuda_graphs", {})
    if "train_speedup" in graphs:
        print(f"  CUDA graphs: x{graphs['train_speedup']} training speed")
    elif graphs:
        print(f"  CUDA graphs: {graphs.get('skipped') or graphs.get('error')}")


# ---------------------------------------------------------------------------- paper, cnn


def recipe_runs(c: Campaign, stage: str, model: str, seeds: list[int]) -> list[RunSpec]:
    specs = [RunSpec(f"seed {seed}", c.work / stage / f"seed-{seed}",
                     c.settings(model=model, seed=seed), fit) for seed in seeds]
    for spec in specs:
        spec.siblings = [other.run_dir for other in specs if other is not spec]
    return specs


def advance_all(c: Campaign, specs: list[RunSpec], budget: Budget,
                test_at_end: bool = False) -> dict:
    """Each run in turn, as far as the budget allows: {label: what happened}."""
    actions = {}
    for spec in specs:
        actions[spec.label] = advance(spec, budget, c.args.finish, print, c.run_argv, test_at_end)
        print(f"{spec.label}: {actions[spec.label]}")
    return actions


def stage_paper(c: Campaign, budget: Budget) -> dict:
    started = time.monotonic()
    specs = recipe_runs(c, "paper", "capsnet", c.seeds)
    actions = advance_all(c, specs, budget)
    runs = [run_summary(spec) for spec in specs]
    complete = all(run["complete"] for run in runs)
    summary = seeds_summary(c, specs) if complete else None
    record = {"recipe": recipe_description(specs[0].settings), "complete": complete,
              "actions": actions, "seeds": runs, "summary": summary,
              "weights": export_best(c, specs, runs, "paper-capsnet")}
    print("== paper ==")
    print("\n".join(describe_run(run) for run in runs))
    if summary:
        print(f"  test error over {len(summary['seeds'])} seeds: "
              f"{100 * summary['test_error_mean']:.2f} ± {100 * summary['test_error_std']:.2f}%; "
              f"ensemble {100 * summary['ensemble_test_error']:.2f}%")
    return c.write("paper", record, started)


def stage_cnn(c: Campaign, budget: Budget) -> dict:
    started = time.monotonic()
    specs = recipe_runs(c, "cnn", "cnn", c.seeds[:1])
    actions = advance_all(c, specs, budget)
    runs = [run_summary(spec) for spec in specs]
    record = {"recipe": recipe_description(specs[0].settings), "complete": runs[0]["complete"],
              "actions": actions, "run": runs[0],
              "weights": export_best(c, specs, runs, "cnn")}
    print("== cnn ==")
    print(describe_run(runs[0]))
    return c.write("cnn", record, started)


def recipe_description(s: TrainSettings) -> dict:
    keys = ("model", "preset", "epochs", "batch_size", "lr", "lr_decay", "routing_iterations",
            "reconstruction_weight", "max_shift", "subset", "val_size", "precision",
            "conv_impl", "compile")
    return {k: getattr(s, k) for k in keys}


def seeds_summary(c: Campaign, specs: list[RunSpec]) -> dict:
    """`capsnet repeat`'s summary (mean ± std, ensemble), computed once per set of runs."""
    results = [read_results(spec.run_dir) for spec in specs]
    key = {spec.label: r["epochs"] for spec, r in zip(specs, results, strict=True)}
    saved = c.work / "paper" / "summary.json"
    if saved.is_file() and json.loads(saved.read_text())["key"] == key:
        return json.loads(saved.read_text())["summary"]
    errors = [r.get("best", r["final"])["error"] for r in results]
    summary = summarise(specs[0].settings, c.seeds, errors,
                        [spec.run_dir / "best.pt" for spec in specs])
    saved.write_text(json.dumps({"key": key, "summary": summary}, indent=2) + "\n")
    return summary


def export_best(c: Campaign, specs: list[RunSpec], runs: list[dict], name: str) -> dict | None:
    """float16 weights of the validation-selected model of the run with the best validation
    accuracy (complete runs first)."""
    ranked = [(run["complete"], run["best_val_accuracy"] or 0.0, i)
              for i, run in enumerate(runs) if (specs[i].run_dir / "best.pt").is_file()]
    if not ranked:
        return None
    _, _, i = max(ranked)
    run = runs[i]
    info = {"stage": name, "run": run["label"], "epoch": run["best_epoch"],
            "best_val_accuracy": run["best_val_accuracy"], "complete": run["complete"],
            "test": run.get("test"), "device": bench.describe_device(c.device)}
    run_dir, file = specs[i].run_dir, f"{name}.safetensors"
    exported = export_selected(run_dir / "best.pt", run_dir / file, c.out / file, info)
    return {"run": run["label"], **exported}


# ---------------------------------------------------------------------------- affNIST, MultiMNIST


def stage_affnist(c: Campaign, budget: Budget) -> dict:
    started, seed = time.monotonic(), c.seeds[0]
    limit = TINY_TEST if c.tiny else None
    specs = [RunSpec(model, c.work / "affnist" / f"{model}-seed-{seed}",
                     c.settings(model=model, seed=seed, target_accuracy=AFFNIST_TARGET,
                                test_limit=limit, keep_every=1), train_affnist)
             for model in ("capsnet", "cnn")]
    actions = advance_all(c, specs, budget)
    runs = [run_summary(spec) for spec in specs]
    complete = all(run["complete"] for run in runs)
    comparison = affnist_comparison(c, specs, limit) if complete else None
    for run in runs:
        curve = run["curve"]
        run["val_accuracy_at_stop"] = curve[-1].get("val_accuracy") if curve else None
    record = {"target_val_accuracy": AFFNIST_TARGET, "complete": complete, "actions": actions,
              "runs": runs, "comparison": comparison}
    print("== affnist ==")
    print("\n".join(describe_run(run) for run in runs))
    if comparison:
        print(format_comparison(comparison))
    return c.write("affnist", record, started)


def affnist_comparison(c: Campaign, specs: list[RunSpec], limit: int | None) -> list[dict]:
    """`compare` on placed MNIST and the affine set of each run's earliest checkpoint that
    reaches the validation accuracy both runs reached (the target when both did), computed
    once per pair of finished runs; each row names its epoch and validation accuracy."""
    key = {spec.label: read_results(spec.run_dir)["epochs"] for spec in specs}
    saved = c.work / "affnist" / "comparison.json"
    if saved.is_file() and json.loads(saved.read_text())["key"] == key:
        return json.loads(saved.read_text())["rows"]
    level, chosen = matched_checkpoints([spec.run_dir for spec in specs])
    models = []
    for spec, kept in zip(specs, chosen, strict=True):
        model = load_model(kept.path, c.device)
        tune_for_inference(model, c.device, spec.settings.precision, spec.settings.conv_impl)
        models.append(NamedModel(spec.label, model))
    test = load_split("mnist", "test", c.args.data_dir, download=False).to(c.device)
    count = len(test.labels) if limit is None else min(limit, len(test.labels))
    rows = compare(models, test.images[:count], test.labels[:count])
    for row, kept in zip(rows, chosen, strict=True):
        row.update(matched_val_accuracy=level, epoch=kept.epoch, val_accuracy=kept.val_accuracy)
    saved.write_text(json.dumps({"key": key, "rows": rows}, indent=2) + "\n")
    return rows


def stage_multimnist(c: Campaign, budget: Budget) -> dict:
    started, seed = time.monotonic(), c.seeds[0]
    spec = RunSpec(f"seed {seed}", c.work / "multimnist" / f"seed-{seed}",
                   c.settings(seed=seed, max_shift=MULTIMNIST_SHIFT,
                              test_pairs=TINY_TEST if c.tiny else None), train_multimnist)
    actions = advance_all(c, [spec], budget, test_at_end=True)
    run = run_summary(spec)
    test = run.get("test")
    record = {"max_shift": MULTIMNIST_SHIFT, "complete": run["complete"], "actions": actions,
              "protocol": "trained as far as the budget allowed and tested there (selected by "
                          "validation); a later call trains on and tests again",
              "run": run, "test_error": test["error"] if test else None,
              "test_pairs": test["pairs"] if test else None}
    print("== multimnist ==")
    print(describe_run(run))
    if test:
        print(f"  test error {pct(test['error'])} on {test['pairs']} pairs after "
              f"{run['epochs_done']} epochs (paper: 5.2%)")
    return c.write("multimnist", record, started)


def check_health(c: Campaign) -> dict:
    """The first minute: device, plan, one timed step, memory (-> health.json). A failure
    is recorded and printed; the stages still run (and say more)."""
    started = time.monotonic()
    settings = c.settings()
    batch = TINY_HEALTH_BATCH if c.tiny else HEALTH_BATCH
    try:
        record = health_check(c.device, settings, batch, HEALTH_STEPS)
    except Exception:  # recorded: the campaign goes on
        record = {"error": traceback.format_exc()[-4000:]}
    print_health(record)
    return c.write("health", {"complete": "error" not in record, **record}, started)


STAGE_FUNCTIONS = {"bench": stage_bench, "paper": stage_paper, "cnn": stage_cnn,
                   "affnist": stage_affnist, "multimnist": stage_multimnist}


# ---------------------------------------------------------------------------- command line


class Tee:
    """stdout to the terminal and to the campaign log."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def parse_args(argv: list[str] | None) -> Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stage", nargs="?", default="all", choices=[*STAGES, "all"])
    p.add_argument("--minutes", type=float, default=8.0,
                   help="time budget of this call in minutes (default 8: one device command "
                   "may run 10)")
    p.add_argument("--stage-minutes", type=float, default=None,
                   help="with 'all': at most this many minutes per stage (default: each stage "
                   "takes what the earlier ones left)")
    p.add_argument("--out", default=os.environ.get("OUT", "runs/gpu-campaign"),
                   help="where the results JSONs, weights and campaign.log go (default $OUT)")
    p.add_argument("--work", default=None,
                   help="run directories and checkpoints, kept between calls "
                   "(default /tmp/capsnet-campaign, or /tmp/capsnet-campaign-tiny)")
    p.add_argument("--data-dir", default=str(REPO / ".gpu-data" / "mnist"),
                   help="the MNIST IDX files (nothing is downloaded; default .gpu-data/mnist)")
    p.add_argument("--device", default="auto", help="auto (cuda, then mps, then cpu), cuda, cpu")
    p.add_argument("--epochs", type=int, default=None,
                   help=f"epochs per run (default {EPOCHS}; with --tiny 1); affnist stops "
                   f"earlier at its target")
    p.add_argument("--seeds", default="1,2,3",
                   help="seeds of the paper stage; the other stages use the first")
    p.add_argument("--compile", action="store_true", help="train with torch.compile")
    p.add_argument("--finish", action="store_true",
                   help="test incomplete runs where they stand instead of waiting for a "
                   "later call (the last call of a session)")
    p.add_argument("--tiny", action="store_true",
                   help="a smoke test in seconds on a CPU: small preset, a few hundred images, "
                   "1 epoch, tiny test sets, bench at batch 2")
    args = p.parse_args(argv)
    args.epochs = args.epochs or (1 if args.tiny else EPOCHS)
    args.work = args.work or f"/tmp/capsnet-campaign{'-tiny' if args.tiny else ''}"
    args.data_dir = str(Path(args.data_dir).resolve())
    if not Path(args.data_dir).is_dir():
        p.error(f"no MNIST in {args.data_dir}: copy the four IDX files there "
                f"(mkdir -p .gpu-data && cp -r ../shared/data/mnist .gpu-data/)")
    if not [s for s in args.seeds.split(",") if s.strip()]:
        p.error("--seeds needs at least one seed")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    c = Campaign(args, pick_device(args.device), Path(args.work), Path(args.out), argv)
    c.out.mkdir(parents=True, exist_ok=True)
    c.work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("CAPSNET_CACHE_DIR", str(c.work / "cache"))  # measured speed plans
    budget = Budget.minutes(args.minutes, **({} if args.tiny else MARGINS))
    stages = STAGES if args.stage == "all" else (args.stage,)
    failed = []
    with open(c.out / "campaign.log", "a") as log, contextlib.redirect_stdout(Tee(sys.stdout, log)):
        print(f"gpu_campaign {' '.join(argv)}: stages {', '.join(stages)} on "
              f"{bench.describe_device(c.device)}, budget {args.minutes:g} min, work {c.work}")
        check_health(c)
        for stage in stages:
            started = time.monotonic()
            try:
                STAGE_FUNCTIONS[stage](c, budget.capped(args.stage_minutes))
            except Exception:  # one stage's failure leaves the others running
                print(traceback.format_exc())
                c.write(stage, {"complete": False, "error": traceback.format_exc()[-4000:]},
                        started)
                failed.append(stage)
            print(f"{stage}: {time.monotonic() - started:.0f} s; "
                  f"{max(0.0, budget.left()) / 60:.1f} min of the budget left")
    if failed:
        print(f"failed stages: {', '.join(failed)} (see their JSON)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
