"""One command for a GPU machine, each stage an existing command in a process of its own
under a time cap (standard library only; SIGTERM writes what is done):

    python -m benchmarks.gpu_campaign --data-dir .gpu-data/mnist --out $OUT
    python -m benchmarks.gpu_campaign --tiny --device cpu --data-dir D --out OUT   # rehearsal

1. health: `capsnet evaluate` of the shipped weights on the device, held to the README's
   CPU figure to one image.
2. speed: two epochs of `capsnet train` eager, --cuda-graph and --compile (GPU only), the
   second epoch's seconds; `benchmarks.bench` against the reference implementation
   (broadcast-style) in the same run, naming the device.
3. official: seeds 1, 2, 3 of `capsnet train --recipe official --monitor-test` at once in
   the fastest mode, stopped (resumable) by --time-limit before the window closes; seeds
   in --work are resumed (stage 2 skipped), so a second command continues them. Then each
   seed's weights by `capsnet export` (float16 safetensors, 15.7 MiB).
--out gets six files, each under 16 MiB: campaign.json (every stage's record, written as
it goes), campaign.log, seed-N.safetensors, curves.tar.gz (each seed's metrics.csv,
results.json, config.json, command.txt).
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tarfile
import time
from pathlib import Path

STARTED = time.monotonic()
REPO = Path(__file__).resolve().parents[1]
SEEDS = (1, 2, 3)
CURVE_FILES = ("metrics.csv", "results.json", "config.json", "command.txt")
MNIST = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
         "t10k-labels-idx1-ubyte")
STATED = re.compile(r"shipped model[^*]*\*\*(\d+\.\d+)% test accuracy\*\*")  # README
MODES = {"eager": (), "graphed": ("--cuda-graph",), "compiled": ("--compile",)}

# A campaign (GPU) and its rehearsal (--tiny, a CPU): the preset, stage caps in seconds ("final":
# kept for the weights and the record), seconds between the seeds' records, runs' arguments.
GPU = {"minutes": 9.0, "preset": "paper", "health": 60, "speed": 180, "epoch_run": 75,
       "final": 25, "snapshot": 10, "threads": "4", "train_args": (),
       "bench_args": ("--batch-size", "128", "--warmup", "3", "--repeats", "10")}
TINY = {"minutes": 2.9, "preset": "small", "health": 30, "speed": 60, "epoch_run": 25,
        "final": 12, "snapshot": 2, "threads": "1", "train_args": ("--subset", "256"),
        "shrink": (2000, 100),
        "bench_args": ("--batch-size", "2", "--warmup", "0", "--repeats", "1")}


class Job:
    """One process in a session of its own, its output in a file; killed past its cap."""

    def __init__(self, c: Campaign, name: str, argv: list[str], cap: float, final=False):
        self.name, self.started = name, time.monotonic()  # final: may use the time kept
        self.cap = min(cap, c.left() - (0 if final else c.p["final"]))
        self.output = c.work / "logs" / f"{name}.log"
        self.proc = None
        if self.cap > 0 and not c.stopping:
            with open(self.output, "w") as out:
                self.proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=c.env,
                                             stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True)
            c.live.add(self)

    def running(self) -> bool:
        if self.proc and self.proc.poll() is None and time.monotonic() - self.started > self.cap:
            self.kill()
        return bool(self.proc) and self.proc.poll() is None

    def kill(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, sig)
                self.proc.wait(3.0)
                return

    def lines(self) -> list[str]:
        return self.output.read_text(errors="replace").splitlines() if self.proc else []

    def wait(self, c: Campaign) -> dict:
        if self.proc is None:
            return {"ok": False, "skipped": "no time left"}
        while self.running():
            time.sleep(0.2)
        c.live.discard(self)
        seconds = time.monotonic() - self.started
        c.log(f"{self.name}: exit {self.proc.returncode} after {seconds:.0f} s" +
              "".join(f"\n  [{self.name}] {line}" for line in self.lines()))
        return {"ok": self.proc.returncode == 0, "rc": self.proc.returncode,
                "seconds": round(seconds, 1), "timed_out": seconds > self.cap,
                "tail": [line[:200] for line in self.lines()[-3:]]}


class Campaign:
    """The options, the clock, the log, the live processes and campaign.json."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.p = args, TINY if args.tiny else GPU
        self.minutes = args.minutes or self.p["minutes"]
        self.out, self.work = Path(args.out), Path(args.work)
        for folder in (self.out, self.work / "logs"):
            folder.mkdir(parents=True, exist_ok=True)
        self.data_dir = str(Path(args.data_dir).resolve())
        self.live, self.stopping, self.record = set(), False, {}
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg",
                    "OMP_NUM_THREADS": self.p["threads"],
                    "CAPSNET_CACHE_DIR": str(self.work / "cache")}

    def left(self) -> float:
        return 60.0 * self.minutes - (time.monotonic() - STARTED)

    def log(self, text: str) -> None:
        line = f"{time.monotonic() - STARTED:6.1f}s {text}"
        with open(self.out / "campaign.log", "a") as f:
            f.write(line + "\n")
        print(line, flush=True)

    def write(self, stage: str, **values) -> None:
        """campaign.json with what is known so far, atomically."""
        self.record.setdefault(stage, {}).update(values)
        self.record["seconds"] = round(time.monotonic() - STARTED, 1)
        (self.out / ".campaign.tmp").write_text(json.dumps(self.record, indent=1) + "\n")
        os.replace(self.out / ".campaign.tmp", self.out / "campaign.json")

    def capsnet(self, *args: str, data: bool = True, device: bool = True) -> list[str]:
        data_args = ("--data-dir", self.data_dir, "--no-download") if data else ()
        return ["-m", "capsnet", *args, *data_args,
                *(("--device", self.args.device) if device else ())]

    def train(self, out_dir: Path, *args: str) -> list[str]:
        return self.capsnet("train", "--preset", self.p["preset"], "--no-progress",
                            "--precision", "fp32", "--out-dir", str(out_dir),
                            *self.p["train_args"], *args)

    def on_signal(self, signum, frame) -> None:  # SIGTERM: as Ctrl-C, write what is done
        self.stopping = True
        raise KeyboardInterrupt(f"signal {signum}")


def read_curve(run_dir: Path) -> list[dict]:
    """A run's metrics.csv, one row an epoch, numbers as numbers."""
    if not (run_dir / "metrics.csv").is_file():
        return []
    with open(run_dir / "metrics.csv") as f:
        return [{k: float(v) if v else None for k, v in row.items()} for row in csv.DictReader(f)]


def shrink_mnist(source: Path, target: Path, train: int, test: int) -> None:
    """The first ``train`` and ``test`` images and labels of an IDX copy of MNIST (raw or
    .gz), written raw: a rehearsal evaluates hundreds of images, not 10,000."""
    target.mkdir(parents=True, exist_ok=True)
    for stem in MNIST:
        path = source / stem if (source / stem).is_file() else source / f"{stem}.gz"
        data = (gzip.open if path.suffix == ".gz" else open)(path, "rb").read()
        dims = data[3]
        shape = list(struct.unpack(f">{dims}I", data[4:4 + 4 * dims]))
        item = 28 * 28 if dims == 3 else 1  # bytes an image or a label
        shape[0] = min(shape[0], train if stem.startswith("train") else test)
        header = data[:4] + struct.pack(f">{dims}I", *shape)
        (target / stem).write_bytes(header + data[4 + 4 * dims:][:shape[0] * item])


def stated_accuracy() -> float:
    """The shipped model's test accuracy that the README states (measured on a CPU)."""
    return float(STATED.search((REPO / "README.md").read_text()).group(1)) / 100


def health(c: Campaign) -> None:
    job = Job(c, "evaluate", c.capsnet("evaluate", "--json", "--precision", "fp32"), c.p["health"])
    record = job.wait(c)
    scores = next((json.loads(line) for line in job.lines() if line.startswith("{")), {})
    accuracy, images, stated = scores.get("accuracy"), scores.get("images"), stated_accuracy()
    if images == 10_000:  # the whole test set: the CPU's figure to one image
        record["ok"] &= abs(accuracy - stated) <= 1 / images + 1e-9
    c.write("health", evaluate_shipped={**record, "accuracy": accuracy, "images": images,
                                        "cpu_figure": stated})


def speed(c: Campaign) -> dict:
    """Two epochs in each mode, one after the other, then the reference benchmark. Returns
    the modes that ran, by their second epoch's seconds."""
    deadline, timed = time.monotonic() + c.p["speed"], {}
    for mode, args in MODES.items():
        if mode == "compiled" and not c.args.device.startswith("cuda"):
            c.write("speed", compiled={"ok": None, "skipped": "timed on a GPU"})
            continue
        run_dir = c.work / "speed" / mode
        shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run (metrics.csv appends)
        record = Job(c, mode, c.train(run_dir, "--epochs", "2", "--val-size", "0", *args),
                     min(c.p["epoch_run"], deadline - time.monotonic())).wait(c)
        curve = read_curve(run_dir)
        if record["ok"] and len(curve) == 2:
            timed[mode] = curve[1]["epoch_seconds"]
            record.update(first_epoch_s=curve[0]["epoch_seconds"], epoch_s=timed[mode],
                          images_per_s=curve[1]["images_per_second"])
        c.write("speed", **{mode: record})
    path = c.work / "bench.json"
    record = Job(c, "bench", ["-m", "benchmarks.bench", "--device", c.args.device,
                              *c.p["bench_args"], "--cases",
                              "broadcast-style,capsnet-fp32-native", "--json", str(path)],
                 max(0.0, deadline - time.monotonic())).wait(c)
    c.write("speed", reference=record, bench=json.loads(path.read_text())
            if path.is_file() else None)
    return timed


def seed_argv(c: Campaign, run_dir: Path, seed: int, mode_args: tuple, limit: int) -> list:
    """The seed's run: resumed where --work holds it, else started."""
    if (run_dir / "last.pt").is_file():
        return c.capsnet("train", "--resume", str(run_dir), "--time-limit", str(limit),
                         "--no-progress")
    shutil.rmtree(run_dir, ignore_errors=True)  # what a run stopped before its first epoch left
    return c.train(run_dir, "--recipe", "official", "--seed", str(seed), "--monitor-test",
                   "--time-limit", str(limit), *mode_args)


def official(c: Campaign, timed: dict) -> None:
    mode = min(timed, key=timed.get, default="eager")
    root, limit = c.work / "official", int(c.left() - 2 * c.p["final"])
    c.write("official", mode=mode, time_limit_s=limit)
    jobs = [Job(c, f"seed-{seed}", seed_argv(c, root / f"seed-{seed}", seed, MODES[mode],
                                             limit), limit + c.p["final"]) for seed in SEEDS]
    while any([job.running() for job in jobs]):
        c.write("official", seeds=seed_records(root))
        time.sleep(c.p["snapshot"])
    runs = {job.name: job.wait(c) for job in jobs}
    exports = [Job(c, f"export-{seed}", c.capsnet(
        "export", str(root / f"seed-{seed}" / "last.pt"), "--format", "safetensors", "-o",
        str(c.out / f"seed-{seed}.safetensors"), data=False, device=False), c.p["final"],
        final=True) for seed in SEEDS if (root / f"seed-{seed}" / "last.pt").is_file()]
    c.write("official", runs=runs, seeds=seed_records(root),
            weights={job.name: job.wait(c) for job in exports})


def seed_records(root: Path) -> dict:
    """Each seed's epochs, last row, last test error (--monitor-test) and final results."""
    found = {}
    for run_dir in sorted(root.glob("seed-*")):
        curve, results = read_curve(run_dir), run_dir / "results.json"
        results = json.loads(results.read_text()) if results.is_file() else {}
        monitored = curve[-1].get("test_accuracy_monitoring") if curve else None
        found[run_dir.name] = {"epochs": len(curve), "last": curve[-1] if curve else None,
                               "last_test_error": None if monitored is None else 1 - monitored,
                               "complete": results.get("complete"),
                               "final_test": results.get("final")}
    return found


def archive(c: Campaign) -> None:
    """curves.tar.gz: each seed's metrics, results, config and command."""
    root = c.work / "official"
    if files := [p for p in sorted(root.glob("seed-*/*")) if p.name in CURVE_FILES]:
        with tarfile.open(c.out / ".curves.tmp", "w:gz") as tar:
            for path in files:
                tar.add(path, arcname=str(path.relative_to(root)))
        os.replace(c.out / ".curves.tmp", c.out / "curves.tar.gz")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--data-dir", default=str(REPO / ".gpu-data" / "mnist"), help="the MNIST IDX files")
    add("--out", default=os.environ.get("OUT", "runs/campaign"), help="default $OUT")
    add("--work", default=str(REPO / ".gpu-work"), help="runs; seeds here are resumed")
    add("--device", default="cuda", help="cuda (default), cuda:1, cpu")
    add("--minutes", type=float, help=f"default {GPU['minutes']:g}, --tiny {TINY['minutes']:g}")
    add("--tiny", action="store_true", help="rehearse on a CPU: small model, few images")
    args = parser.parse_args(argv)
    if not Path(args.data_dir).is_dir():
        parser.error(f"no MNIST in {args.data_dir}: put the four IDX files there")
    return args


def main(argv: list[str] | None = None) -> int:
    c = Campaign(parse_args(argv))
    signal.signal(signal.SIGTERM, c.on_signal)
    c.log(f"gpu_campaign on {c.args.device}: {c.minutes:g} min, work {c.work}, out {c.out}")
    code = 0
    try:
        if "shrink" in c.p:
            shrink_mnist(Path(c.data_dir), c.work / "mnist", *c.p["shrink"])
            c.data_dir = str(c.work / "mnist")
        health(c)
        if any((c.work / "official").glob("seed-*/last.pt")):  # a second command: train
            c.write("speed", skipped="seeds in --work resumed: the first command timed them")
            official(c, {})
        else:
            official(c, speed(c))
        c.write("state", done=True)
    except KeyboardInterrupt:
        c.log("stopped (SIGTERM or Ctrl-C): writing what is done")
        code = 143
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for job in list(c.live):
            job.kill()
        archive(c)
        c.write("state", done=code == 0, files=sorted(p.name for p in c.out.iterdir()
                                                      if not p.name.startswith(".")))
        c.log(f"done in {time.monotonic() - STARTED:.0f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
