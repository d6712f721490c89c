"""One command for a GPU machine: a short health check, the paper CapsNet's epoch eager,
graphed and compiled beside the reference implementation, then three seeds of the released
code's recipe (`capsnet train --recipe official`) at once, for as long as the window holds.

    python -m benchmarks.gpu_campaign --data-dir .gpu-data/mnist --out $OUT
    python -m benchmarks.gpu_campaign --tiny --device cpu --data-dir D --out OUT   # rehearsal

Each stage is an existing command in a process of its own under a time cap:
  1. health: the device's facts (benchmarks/campaign_health.py); `capsnet evaluate` of the
     shipped weights on the device, against the README's CPU figure.
  2. speed: two epochs of `capsnet train` eager, with --cuda-graph (when capsnet has it) and
     with --compile (GPU only): the second epoch's seconds; `benchmarks.bench` of capsnet
     against the reference implementation (broadcast-style) in the same run.
  3. official: seeds 1, 2, 3 of `capsnet train --recipe official --monitor-test` at once,
     in the fastest mode of stage 2, each stopped (resumable) by --time-limit before the
     window closes. Seeds already in --work are resumed in the mode they started in (stage
     2 skipped), so a second command continues the same three. Then each seed's weights
     (float16 safetensors, 15.7 MiB).
--out gets campaign.json (every stage's record, written as it goes), campaign.log,
seed-N.safetensors and curves.tar.gz (each seed's metrics.csv, results.json, config.json):
six files, each under 16 MiB. SIGTERM writes what is done. Standard library only.
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
import threading
import time
from pathlib import Path

STARTED = time.monotonic()
REPO = Path(__file__).resolve().parents[1]
SEEDS = (1, 2, 3)
GRAPH_FLAG = "--cuda-graph"  # `capsnet train`'s captured step, where capsnet/cli/args.py has it
SNAPSHOT = 10.0  # seconds between the seeds' curves in campaign.json
KILL_GRACE = 3.0
CURVE_FILES = ("metrics.csv", "results.json", "config.json", "command.txt")
MNIST = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
         "t10k-labels-idx1-ubyte")
BENCH_CASES = "broadcast-style,capsnet-fp32-native"
STATED = re.compile(r"shipped model[^*]*\*\*(\d+\.\d+)% test accuracy\*\*")  # README
MNIST_TEST_IMAGES = 10_000

# The sizes of a real campaign (GPU) and of its rehearsal (--tiny, a CPU): the model preset,
# each stage's cap in seconds, the timed runs' and the seeds' extra arguments.
# "final": seconds kept for the weights, the archive and the last record.
GPU = {"minutes": 9.0, "preset": "paper", "health": 60, "speed": 180, "epoch_run": 75, "final": 25,
       "precision": "fp32", "speed_args": (), "official_args": (), "threads": "4",
       "bench_args": ("--batch-size", "128", "--warmup", "3", "--repeats", "10")}
TINY = {"minutes": 2.9, "preset": "small", "health": 40, "speed": 80, "epoch_run": 30, "final": 12,
        "precision": "fp32", "speed_args": ("--subset", "256"), "threads": "1",
        "official_args": ("--subset", "256"), "shrink": (2000, 100),
        "bench_args": ("--batch-size", "2", "--warmup", "0", "--repeats", "1")}


class Stopped(BaseException):
    """SIGTERM: write what is done and end."""


class Job:
    """One process, its own session, its lines logged; killed past its cap."""

    def __init__(self, c: Campaign, name: str, argv: list[str], cap: float,
                 final: bool = False):
        self.name, self.lines = name, []  # final: may run in the time kept for the end
        self.cap = min(cap, c.left() - (0 if final else c.p["final"]))
        self.started = time.monotonic()
        self.proc = None if self.cap <= 0 or c.stopping else subprocess.Popen(
            [sys.executable, *argv], cwd=REPO, env=c.env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
        if self.proc:
            c.live.add(self)
            self.reader = threading.Thread(target=self._read, args=(c,), daemon=True)
            self.reader.start()

    def _read(self, c: Campaign) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            c.log(f"[{self.name}] {line.rstrip()}")

    def running(self) -> bool:
        if self.proc and self.proc.poll() is None and time.monotonic() - self.started > self.cap:
            self.kill()
        return bool(self.proc) and self.proc.poll() is None

    def kill(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(KILL_GRACE)
                return

    def wait(self, c: Campaign) -> dict:
        if self.proc is None:
            return {"ok": False, "skipped": "no time left"}
        while self.running():
            time.sleep(0.2)
        self.reader.join(5.0)
        c.live.discard(self)
        seconds = time.monotonic() - self.started
        return {"ok": self.proc.returncode == 0, "rc": self.proc.returncode,
                "seconds": round(seconds, 1), "timed_out": seconds > self.cap,
                "tail": [line[:200] for line in self.lines[-3:]]}


class Campaign:
    """The options, the clock, the log, the live processes and campaign.json."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.p = args, TINY if args.tiny else GPU
        self.minutes = args.minutes or self.p["minutes"]
        self.out, self.work = Path(args.out), Path(args.work)
        for folder in (self.out, self.work):
            folder.mkdir(parents=True, exist_ok=True)
        self.data_dir = str(Path(args.data_dir).resolve())
        self.live, self.stopping, self.record, self.lock = set(), False, {}, threading.RLock()
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg",
                    "OMP_NUM_THREADS": self.p["threads"],
                    "CAPSNET_CACHE_DIR": str(self.work / "cache")}
        self.log_file = open(self.out / "campaign.log", "a", buffering=1)  # noqa: SIM115

    def left(self) -> float:
        return 60.0 * self.minutes - (time.monotonic() - STARTED)

    def log(self, text: str) -> None:
        with self.lock:
            line = f"{time.monotonic() - STARTED:6.1f}s {text}"
            self.log_file.write(line + "\n")
            print(line, flush=True)

    def write(self, stage: str, **values) -> None:
        """campaign.json with what is known so far, atomically."""
        with self.lock:
            self.record.setdefault(stage, {}).update(values)
            self.record["seconds"] = round(time.monotonic() - STARTED, 1)
            tmp = self.out / ".campaign.json.tmp"
            tmp.write_text(json.dumps(self.record, indent=1) + "\n")
            os.replace(tmp, self.out / "campaign.json")

    def capsnet(self, *args: str, data: bool = True, device: bool = True) -> list[str]:
        data_args = ("--data-dir", self.data_dir, "--no-download") if data else ()
        return ["-m", "capsnet", *args, *data_args,
                *(("--device", self.args.device) if device else ())]

    def train(self, out_dir: Path, *args: str) -> list[str]:
        return self.capsnet("train", "--preset", self.p["preset"], "--no-progress",
                            "--precision", self.p["precision"], "--out-dir", str(out_dir), *args)

    def on_signal(self, signum, frame) -> None:
        self.stopping = True
        raise Stopped(f"signal {signum}")


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
        item = 1
        for size in shape[1:]:
            item *= size
        shape[0] = min(shape[0], train if stem.startswith("train") else test)
        header = data[:4] + struct.pack(f">{dims}I", *shape)
        (target / stem).write_bytes(header + data[4 + 4 * dims:][:shape[0] * item])


def stated_accuracy() -> float | None:
    """The shipped model's test accuracy that the README states (measured on a CPU)."""
    found = STATED.search((REPO / "README.md").read_text())
    return float(found.group(1)) / 100 if found else None


def health(c: Campaign) -> None:
    facts = Job(c, "facts", ["-m", "benchmarks.campaign_health", c.args.device], c.p["health"])
    shipped = Job(c, "evaluate", c.capsnet("evaluate", "--json", "--precision", "fp32"),
                  c.p["health"])
    found = {"facts": facts.wait(c), "evaluate-shipped": shipped.wait(c)}
    device = next((json.loads(line) for line in facts.lines if line.startswith("{")), {})
    scores = next((json.loads(line) for line in shipped.lines if line.startswith("{")), {})
    accuracy, images, stated = scores.get("accuracy"), scores.get("images"), stated_accuracy()
    if images == MNIST_TEST_IMAGES:  # the CPU's figure to one image (a rehearsal: any)
        found["evaluate-shipped"]["ok"] &= abs(accuracy - stated) <= 1 / images + 1e-9
    found["evaluate-shipped"].update(accuracy=accuracy, images=images, cpu_figure=stated)
    c.write("health", device=device, **found)


def speed(c: Campaign) -> dict:
    """Two epochs in each mode, one after the other; the second epoch's seconds. Returns the
    modes that ran, by their epoch seconds."""
    gpu = c.args.device.startswith("cuda")
    graphed = GRAPH_FLAG in (REPO / "capsnet" / "cli" / "args.py").read_text()
    modes = {"eager": (), "graphed": (GRAPH_FLAG,) if graphed else None,
             "compiled": ("--compile",) if gpu else None}
    why = {"graphed": f"capsnet train has no {GRAPH_FLAG} yet", "compiled": "timed on a GPU"}
    deadline, timed = time.monotonic() + c.p["speed"], {}
    for mode, args in modes.items():
        if args is None:
            c.write("speed", **{mode: {"ok": None, "skipped": why[mode]}})
            continue
        run_dir = c.work / "speed" / mode
        shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run (metrics.csv appends)
        cap = min(c.p["epoch_run"], deadline - time.monotonic())
        record = Job(c, mode, c.train(run_dir, "--epochs", "2", "--val-size", "0",
                                      *c.p["speed_args"], *args), cap).wait(c)
        curve = read_curve(run_dir)
        if record["ok"] and len(curve) == 2:
            timed[mode] = curve[1]["epoch_seconds"]
            record.update(first_epoch_s=curve[0]["epoch_seconds"], epoch_s=timed[mode],
                          images_per_s=curve[1]["images_per_second"])
        c.write("speed", **{mode: record})
    path = c.work / "bench.json"
    cap = max(0.0, deadline - time.monotonic())
    record = Job(c, "bench", ["-m", "benchmarks.bench", "--device", c.args.device,
                              *c.p["bench_args"], "--cases", BENCH_CASES, "--json", str(path)],
                 cap).wait(c)
    c.write("speed", reference=record, cases=json.loads(path.read_text())
            if path.is_file() else None)
    return timed


def seed_argv(c: Campaign, run_dir: Path, seed: int, mode_args: tuple, limit: int) -> list:
    """The seed's run: resumed where --work holds it, else started."""
    if (run_dir / "last.pt").is_file():
        return c.capsnet("train", "--resume", str(run_dir), "--time-limit", str(limit),
                         "--no-progress")
    shutil.rmtree(run_dir, ignore_errors=True)  # what a run stopped before its first epoch left
    return c.train(run_dir, "--recipe", "official", "--seed", str(seed), "--monitor-test",
                   "--time-limit", str(limit), *c.p["official_args"], *mode_args)


def official(c: Campaign, timed: dict) -> None:
    mode = min(timed, key=timed.get, default="eager")
    mode_args = {"eager": (), "graphed": (GRAPH_FLAG,), "compiled": ("--compile",)}[mode]
    root, limit = c.work / "official", int(c.left() - 2 * c.p["final"])
    c.write("official", mode=mode, time_limit_s=limit)
    jobs = {seed: Job(c, f"seed-{seed}", seed_argv(c, root / f"seed-{seed}", seed, mode_args,
                                                     limit), limit + c.p["final"])
            for seed in SEEDS}
    while any([job.running() for job in jobs.values()]):
        c.write("official", seeds=seed_records(root))
        time.sleep(SNAPSHOT)
    runs = {f"seed-{seed}": job.wait(c) for seed, job in jobs.items()}
    exports = [Job(c, f"export-{seed}", c.capsnet(
        "export", str(root / f"seed-{seed}" / "last.pt"), "--format", "safetensors", "-o",
        str(c.out / f"seed-{seed}.safetensors"), data=False, device=False), c.p["final"],
        final=True)
        for seed in SEEDS if (root / f"seed-{seed}" / "last.pt").is_file()]
    c.write("official", runs=runs, seeds=seed_records(root),
            weights={job.name: job.wait(c) for job in exports})


def seed_records(root: Path) -> dict:
    """Each seed's epochs done, its last epoch's row and test error (--monitor-test), and
    once it has run all its epochs, its tested results."""
    found = {}
    for run_dir in sorted(root.glob("seed-*")):
        curve = read_curve(run_dir)
        results = json.loads((run_dir / "results.json").read_text()) if (
            run_dir / "results.json").is_file() else {}
        monitored = curve[-1].get("test_accuracy_monitoring") if curve else None
        found[run_dir.name] = {"epochs": len(curve), "last": curve[-1] if curve else None,
                               "last_test_error": None if monitored is None else 1 - monitored,
                               "complete": results.get("complete"),
                               "final_test": results.get("final")}
    return found


def archive(c: Campaign) -> None:
    """curves.tar.gz: each seed's metrics, results, config and command."""
    root = c.work / "official"
    files = [p for p in sorted(root.glob("seed-*/*")) if p.name in CURVE_FILES]
    if files:
        with tarfile.open(c.out / ".curves.tmp", "w:gz") as tar:
            for path in files:
                tar.add(path, arcname=str(path.relative_to(root)))
        os.replace(c.out / ".curves.tmp", c.out / "curves.tar.gz")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default=str(REPO / ".gpu-data" / "mnist"),
                        help="the four MNIST IDX files (never downloaded; default "
                             ".gpu-data/mnist)")
    parser.add_argument("--out", default=os.environ.get("OUT", "runs/campaign"),
                        help="the results, six files (default $OUT, else runs/campaign)")
    parser.add_argument("--work", default=str(REPO / ".gpu-work"),
                        help="run directories and checkpoints; the seeds found here are "
                             "resumed (default .gpu-work, git-ignored)")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:1, cpu")
    parser.add_argument("--minutes", type=float, default=None,
                        help=f"the budget (default {GPU['minutes']:g}; --tiny {TINY['minutes']:g})")
    parser.add_argument("--tiny", action="store_true",
                        help="rehearse on a CPU: small models, a few hundred images")
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
    except Stopped:
        c.log("SIGTERM: writing what is done")
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
