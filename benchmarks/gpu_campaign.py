"""One command for a fresh GPU machine: is it healthy, how fast is an epoch, and the paper's
three-seed protocol, each part capped and written to --out the moment it ends.

    python -m benchmarks.gpu_campaign first --data-dir .gpu-data/mnist --out OUT
    python -m benchmarks.gpu_campaign first --tiny --device cpu --data-dir D --out OUT

The plan of minutes (--minutes 9; the clock starts with the process):
  1. health (cap 1.5 min): device facts; a few training steps of the paper CapsNet in fp32,
     bf16 and fp16 (gradient scaling), of the CNN, the EM model and Efficient-CapsNet;
     resume equal to an uninterrupted run; a real out-of-memory turned into one line;
     `evaluate` of the shipped weights on the device against the CPU; the affine test set,
     predict, the routing figure and ONNX/TorchScript export. torch.compile warms in the
     background meanwhile (one batch shape, capped).                      -> health.json
  2. epoch times (cap 1.7 min): two full epochs of the paper CapsNet in fp32 and in the
     automatic choice: training, validation and checkpoint seconds, peak memory against the
     estimate; the compiled run's compile seconds and epoch time.         -> bench.json
  3. the protocol (the rest): seeds 1, 2, 3 at once, the paper recipe (50 epochs) when the
     measured epoch says all three finish with a margin, else the fast recipe; each tested
     once; mean ± std and the ensemble (`capsnet repeat`); curves every few seconds.
                          -> protocol.json, paper-capsnet.safetensors, seeds.tar.gz
  4. only with time left: the eager benchmark cases against the reference implementations
     (benchmarks/bench.py).                                               -> bench.json
Every part runs in processes of its own with a hard cap; a failed check is recorded and the
command goes on; SIGTERM writes what is done. This file imports the standard library only.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

STARTED = time.monotonic()  # the budget's clock: only the standard library is loaded before
REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "capsnet" / "weights" / "capsnet-mnist.safetensors"
RESULT_PREFIX = "campaign-result: "  # benchmarks/campaign_health.py's last line
OUT_LIMITS = {"files": 8, "file_bytes": 16 * 2**20, "depth": 2}  # what a command brings back
SAFE_NAME = re.compile(r"[A-Za-z0-9._-]+")
SEEDS = (1, 2, 3)
# Each of three seeds' epochs on one GPU against one run alone: 1.06 measured on an H200
# (results/gpu-h200), with room for slower cards; protocol.json records the real one.
CONCURRENT_SLOWDOWN = 1.2
GATE_MARGIN = 0.15  # the protocol must fit in the time left with this fraction to spare
SNAPSHOT_SECONDS = 5.0  # protocol.json's curves while the seeds train
KILL_GRACE = 3.0  # seconds between SIGTERM and SIGKILL for a job past its cap
ZYGOTE_WAIT = 60.0  # seconds for the fork server's answer (it imports torch first)
EPOCH_LINE = re.compile(r"^epoch (\d+) \|")
ONE_SHAPE_SUBSET = 429 * 128  # 54,912 training images: every compiled batch 128 images
MNIST_TEST_IMAGES = 10_000
STATED = re.compile(r"shipped model[^*]*\*\*(\d+\.\d+)% test accuracy\*\*")  # README


@dataclass(frozen=True)
class Profile:
    """The sizes of a real campaign (GPU) or its rehearsal (--tiny, a CPU)."""

    minutes: float
    caps: dict  # seconds: health, check, epochs, epoch_run, compile
    preset: str
    check_args: tuple  # a health check's training size
    epoch_args: tuple  # the timed epochs' size (empty: all 55,000 images)
    recipe_epochs: dict
    concurrency: int  # health checks at a time
    protocol_fixed: float  # seconds of the protocol besides its epochs: start, test, summary
    final: float  # seconds kept for the end: finishing stopped seeds, archive, last JSON
    bench_min: float  # the benchmark cases run only with this much time left
    bench_args: tuple
    threads: str | None = None  # OMP_NUM_THREADS of each process
    shrink: tuple | None = None  # (train, test) images of a smaller MNIST copy
    robustness_limit: int = 2000


GPU = Profile(
    minutes=9.0, caps={"health": 90, "check": 75, "epochs": 100, "epoch_run": 60, "compile": 240},
    preset="paper", check_args=("--subset", "512", "--val-size", "500"), epoch_args=(),
    recipe_epochs={"paper": 50, "fast": 15}, concurrency=4, protocol_fixed=40.0, final=25.0,
    bench_min=60.0, threads="4",
    bench_args=("--batch-size", "128", "--warmup", "3", "--repeats", "10", "--cases",
                "seed-style,broadcast-style,capsnet,capsnet-fp32-native,capsnet-bf16-native,"
                "capsnet-bf16-channels_last"))
TINY = Profile(
    minutes=2.9, caps={"health": 90, "check": 45, "epochs": 40, "epoch_run": 30, "compile": 0},
    preset="small", check_args=("--subset", "128", "--val-size", "100", "--batch-size", "32"),
    epoch_args=("--subset", "512", "--val-size", "100"), recipe_epochs={"paper": 3, "fast": 2},
    concurrency=2, protocol_fixed=15.0, final=6.0, bench_min=20.0, threads="1",
    bench_args=("--batch-size", "2", "--warmup", "0", "--repeats", "1",
                "--cases", "capsnet,broadcast-style"), shrink=(2000, 100), robustness_limit=100)


class Stopped(BaseException):
    """SIGTERM: write what is done and end (no part catches it as its own failure)."""


class OutOfTime(Exception):
    """A job that would start past its part's cap or the command's budget."""


def pick_recipe(epoch_seconds: float | None, seconds_left: float, recipe_epochs: dict,
                fixed: float, seeds: int = len(SEEDS)) -> dict:
    """The gate: the paper recipe when its epochs, for ``seeds`` concurrent runs, and
    ``fixed`` seconds of start-up and test fit in ``seconds_left`` with GATE_MARGIN to spare;
    else the fast recipe, its epochs cut to what fits (at least one). ``epoch_seconds`` is
    one run's epoch alone, validation and checkpoint included (None: not measured)."""
    slowdown = CONCURRENT_SLOWDOWN if seeds > 1 else 1.0
    usable = seconds_left / (1 + GATE_MARGIN) - fixed
    if epoch_seconds is None:
        return {"recipe": "fast", "epochs": recipe_epochs["fast"], "predicted_seconds": None,
                "why": "no epoch time measured: the fast recipe, stopped by its time limit"}
    per_epoch = epoch_seconds * slowdown
    for recipe in ("paper", "fast"):
        if recipe_epochs[recipe] * per_epoch <= usable:
            return {"recipe": recipe, "epochs": recipe_epochs[recipe],
                    "predicted_seconds": round(fixed + recipe_epochs[recipe] * per_epoch, 1),
                    "why": f"{recipe_epochs[recipe]} epochs x {per_epoch:.1f} s fit in "
                           f"{usable:.0f} s"}
    epochs = max(1, min(recipe_epochs["fast"], math.floor(usable / per_epoch)))
    return {"recipe": "fast", "epochs": epochs,
            "predicted_seconds": round(fixed + epochs * per_epoch, 1),
            "why": f"only {epochs} epochs x {per_epoch:.1f} s fit in {usable:.0f} s"}


def out_problems(out: Path) -> list[str]:
    """What would not come back from ``out``: more than 8 files, a file over 16 MiB, a file
    more than two folders down, a name of other characters than letters, digits, . _ -."""
    files = [p for p in out.rglob("*") if not p.is_dir()]
    problems = [f"{len(files)} files, over {OUT_LIMITS['files']}"] * (
        len(files) > OUT_LIMITS["files"])
    for path in files:
        rel = path.relative_to(out)
        if len(rel.parts) - 1 > OUT_LIMITS["depth"]:
            problems.append(f"{rel}: more than {OUT_LIMITS['depth']} folders down")
        if not all(SAFE_NAME.fullmatch(part) for part in rel.parts):
            problems.append(f"{rel}: a name of other characters than letters, digits, . _ -")
        if path.is_file() and path.stat().st_size > OUT_LIMITS["file_bytes"]:
            problems.append(f"{rel}: {path.stat().st_size / 2**20:.1f} MiB, over 16 MiB")
    return problems


class Forked:
    """What a Job uses of a Popen, for a process that the Zygote forked."""

    def __init__(self, fifo: Path):
        self.fifo, self.pid, self.returncode, self.abandoned = fifo, None, None, False
        self.started, self.ended = threading.Event(), threading.Event()

    def answer(self, message: dict) -> None:
        self.pid = message.get("pid", self.pid)
        if self.abandoned and "pid" in message:  # too late: a fresh process runs the job
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        self.started.set()
        if "rc" in message:
            self.returncode = message["rc"]
            self.ended.set()

    @property
    def stdout(self):
        return open(self.fifo)  # waits for the process to open its end

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self.ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
        return self.returncode


class Zygote:
    """benchmarks/campaign_health.py serve: torch imported once, each job a fork of it."""

    def __init__(self, c: Campaign):
        self.fifos, self.forked, self.lock = c.work / "fifos", {}, threading.Lock()
        self.fifos.mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.campaign_health", "serve"], cwd=REPO, env=c.env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            start_new_session=True)
        threading.Thread(target=self._answers, daemon=True).start()

    def _answers(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                message = json.loads(line)
                self.forked[message["id"]].answer(message)
        for forked in list(self.forked.values()):  # the server is gone: so are its jobs
            if forked.pid and forked.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(forked.pid, signal.SIGKILL)
            forked.answer({"rc": -signal.SIGKILL})

    def start(self, argv: list, env: dict) -> Forked | None:
        """The job forked, or None when the server is gone (then a fresh process runs it)."""
        with self.lock:
            if self.proc.poll() is not None:
                return None
            key = len(self.forked) + 1
            forked = self.forked[key] = Forked(self.fifos / f"job-{key}")
            os.mkfifo(forked.fifo)
            try:
                self.proc.stdin.write(json.dumps({"id": key, "argv": argv, "env": env, "cwd":
                                                  str(REPO), "fifo": str(forked.fifo)}) + "\n")
                self.proc.stdin.flush()
            except OSError:  # it ended between the check and the request
                return None
        if forked.started.wait(ZYGOTE_WAIT) and forked.pid:
            return forked
        forked.abandoned = True
        return None

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            os.killpg(self.proc.pid, signal.SIGTERM)
        except (OSError, ProcessLookupError):
            pass


@dataclass(eq=False)
class Job:
    """One process with a hard cap: its output goes to the log line by line, timestamped."""

    name: str
    argv: list
    cap: float
    env: dict = field(default_factory=dict)
    lines: list = field(default_factory=list)  # (seconds since its start, line)

    def start(self, c: Campaign) -> Job:
        with c.lock:
            if c.stopping:
                raise Stopped("stopping")
            left = min(c.left() - c.profile.final, c.part_deadline - time.monotonic())
            if left <= 0:
                raise OutOfTime(f"no time left to start {self.name}")
            self.cap = min(self.cap, left)
            self.started = time.monotonic()
        self.proc = c.zygote.start(self.argv, {**c.env, **self.env}) if c.zygote else None
        self.proc = self.proc or subprocess.Popen(
            [sys.executable, *self.argv], cwd=REPO, env={**c.env, **self.env},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            start_new_session=True)  # its own group: killed with everything it started
        with c.lock:
            c.live.add(self)
        if c.stopping:  # SIGTERM came while it started
            self.kill()
        self.reader = threading.Thread(target=self._read, args=(c,), daemon=True)
        self.reader.start()
        return self

    def _read(self, c: Campaign) -> None:
        with self.proc.stdout as lines:
            for line in lines:
                self.lines.append((time.monotonic() - self.started, line.rstrip("\n")))
                c.log(f"[{self.name}] {line.rstrip()}")

    def done(self) -> bool:
        """Finished, or killed now for running past its cap."""
        if self.proc.poll() is None and time.monotonic() - self.started > self.cap:
            self.timed_out = True
            self.kill()
        return self.proc.poll() is not None

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        for sig, grace in ((signal.SIGTERM, KILL_GRACE), (signal.SIGKILL, 5.0)):
            self.signal(sig)
            try:
                self.proc.wait(grace)
                return
            except subprocess.TimeoutExpired:
                continue

    def wait(self, c: Campaign) -> dict:
        while not self.done():
            time.sleep(0.2)
        self.reader.join(5.0)
        c.live.discard(self)
        results = [json.loads(line[len(RESULT_PREFIX):]) for _, line in self.lines
                   if line.startswith(RESULT_PREFIX)]
        return {"ok": self.proc.returncode == 0, "rc": self.proc.returncode,
                "started_at_s": round(self.started - STARTED, 1),
                "seconds": round(time.monotonic() - self.started, 1),
                "timed_out": getattr(self, "timed_out", False),
                **({"result": results[-1]} if results else {}),
                "tail": [line for _, line in self.lines[-4:]]}

    def run(self, c: Campaign) -> dict:
        return self.start(c).wait(c)

    def epoch_times(self) -> list[float]:
        """When each epoch's line came, in seconds since the start."""
        return [t for t, line in self.lines if EPOCH_LINE.match(line)]


class Campaign:
    """The options, the budget, the log, the live processes and the records in --out."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.profile = args, TINY if args.tiny else GPU
        self.minutes = args.minutes or self.profile.minutes
        self.out, self.work = Path(args.out), Path(args.work or tempfile.mkdtemp("-capsnet"))
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.gpu = args.device.startswith("cuda")
        self.data_dir = str(Path(args.data_dir).resolve())
        self.lock, self.live, self.stopping, self.records = threading.RLock(), set(), False, {}
        self.epoch_seconds: float | None = None  # one epoch alone, measured by epoch_times
        self.train_seconds: float | None = None  # its training part
        self.part_deadline = math.inf  # no job of the part running outlives it
        self.zygote: Zygote | None = None
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
            "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
            "CAPSNET_CACHE_DIR": str(self.work / "cache")}  # the speed plans, measured once
        if self.profile.threads:
            self.env["OMP_NUM_THREADS"] = self.profile.threads
        self.log_file = open(self.out / "campaign.log", "a", buffering=1)  # noqa: SIM115

    def left(self) -> float:
        return 60.0 * self.minutes - (time.monotonic() - STARTED)

    def log(self, text: str) -> None:
        line = f"{time.monotonic() - STARTED:6.1f}s {text}"
        with self.lock:
            self.log_file.write(line + "\n")
            print(line, flush=True)

    def write(self, part: str, state: str = "running", **values) -> None:
        """--out/<part>.json, atomically, with what is known so far."""
        with self.lock:
            record = self.records.setdefault(part, {"part": part})
            record.update(values, state=state, written_at_s=round(time.monotonic() - STARTED, 1))
            tmp = self.out / f".{part}.json.tmp"
            tmp.write_text(json.dumps(record, indent=2) + "\n")
            os.replace(tmp, self.out / f"{part}.json")

    def capsnet(self, *args: str, data: bool = True, device: str | None = None) -> list[str]:
        """A `capsnet` command on --device (or ``device``; "" for none), its data read from
        --data-dir (never downloaded) unless ``data`` is False."""
        device = self.args.device if device is None else device
        data_args = ("--data-dir", self.data_dir, "--no-download") if data else ()
        return ["-m", "capsnet", *args, *data_args, *(("--device", device) if device else ())]

    def train(self, out_dir: Path, *args: str) -> list[str]:
        return self.capsnet("train", "--preset", self.profile.preset, "--no-progress",
                            "--out-dir", str(out_dir), *args)

    def on_signal(self, signum, frame) -> None:
        self.stopping = True  # no job starts any more
        raise Stopped(f"signal {signum}")

    def stop_all(self) -> None:
        with self.lock:
            self.stopping = True
            live = list(self.live)
        for job in live:
            job.signal(signal.SIGTERM)
        for job in live:
            job.kill()


# ---------------------------------------------------------------------------- 1. health


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def read_curve(run_dir: Path) -> list[dict]:
    """A run's metrics.csv (one row an epoch), numbers as numbers."""
    if not (run_dir / "metrics.csv").is_file():
        return []
    with open(run_dir / "metrics.csv") as f:
        return [{k: float(v) if v not in ("", None) else None for k, v in row.items()}
                for row in csv.DictReader(f)]


def check_training(c: Campaign, name: str, *args: str) -> dict:
    run_dir = c.work / "checks" / name
    record = Job(name, c.train(run_dir, "--epochs", "1", *c.profile.check_args, *args),
                 c.profile.caps["check"]).run(c)
    curve, results = read_curve(run_dir), read_json(run_dir / "results.json") or {}
    loss = curve[-1]["train_loss"] if curve else None
    record["ok"] = record["ok"] and loss is not None and math.isfinite(loss)
    return {name: {**record, "train_loss": loss,
                   "test_accuracy": (results.get("final") or {}).get("accuracy")}}


def check_resume(c: Campaign) -> dict:
    """Two epochs in one run against one epoch then a resume to two (deterministic cuDNN);
    then the checkpoint written on the device exported to ONNX."""
    whole, split = c.work / "checks" / "resume-whole", c.work / "checks" / "resume-split"
    args = (*c.profile.check_args, "--deterministic", "--seed", "5")
    runs = [Job("resume-whole", c.train(whole, "--epochs", "2", *args), c.profile.caps["check"]),
            Job("resume-first", c.train(split, "--epochs", "1", *args), c.profile.caps["check"]),
            Job("resume-rest", c.capsnet("train", "--resume", str(split), "--epochs", "2",
                                         "--no-progress"), c.profile.caps["check"])]
    records = [job.run(c) for job in runs]
    a, b = read_curve(whole), read_curve(split)
    keys = ("train_loss", "train_accuracy", "val_accuracy")
    diffs = {k: abs(a[-1][k] - b[-1][k]) for k in keys if len(a) == len(b) == 2 and a[-1][k]
             is not None}
    ok = all(r["ok"] for r in records) and len(diffs) == len(keys) and max(diffs.values()) < 1e-4
    found = {"resume": {"ok": ok, "epoch_2_differences": diffs, "runs": records}}
    found["export-onnx"] = Job("export-onnx", c.capsnet(
        "export", str(whole / "best.pt"), "--format", "onnx", "-o", str(c.work / "model.onnx"),
        data=False, device=""), c.profile.caps["check"]).run(c) if importlib.util.find_spec(
        "onnx") else {"ok": None, "skipped": "onnx not installed"}
    return found


def check_out_of_memory(c: Campaign) -> dict:
    """A batch of all 55,000 images in float32 with 10 routing iterations: the one-line error.
    (With 3 iterations, about 160 GiB, an H200's 139.8 GiB ran out only after the 45 s cap;
    --deterministic skips cuDNN's algorithm search at that batch.)"""
    if not c.gpu:
        return {"out-of-memory": {"ok": None, "skipped": "needs a GPU"}}
    record = Job("out-of-memory", c.train(c.work / "checks" / "oom", "--batch-size", "55000",
                                          "--precision", "fp32", "--conv-impl", "native",
                                          "--routing-iterations", "10", "--deterministic",
                                          "--epochs", "1"), c.profile.caps["check"]).run(c)
    last = record["tail"][-1] if record["tail"] else ""
    record["ok"] = record["rc"] == 1 and last.startswith("capsnet: error:") and "memory" in last
    return {"out-of-memory": {**record, "line": last}}


def stated_accuracy() -> float | None:
    """The shipped model's test accuracy that the README states (measured on a CPU)."""
    found = STATED.search((REPO / "README.md").read_text())
    return float(found.group(1)) / 100 if found else None


def check_evaluate(c: Campaign) -> dict:
    """The shipped weights evaluated on the device in float32: the README's CPU figure to one
    image (on the 10,000 MNIST test images; a smaller test set is only evaluated)."""
    record = Job("evaluate", c.capsnet("evaluate", "--json", "--precision", "fp32"),
                 c.profile.caps["check"]).run(c)
    found = json.loads(next((line for line in record["tail"] if line.startswith("{")), "{}"))
    accuracy, images, stated = found.get("accuracy"), found.get("images"), stated_accuracy()
    record["ok"] = record["ok"] and accuracy is not None and (
        images != MNIST_TEST_IMAGES or abs(accuracy - stated) <= 1 / images + 1e-9)
    full = images == MNIST_TEST_IMAGES and accuracy is not None
    return {"evaluate-shipped": {**record, "accuracy": accuracy, "images": images,
                                 "cpu_figure": stated if full else None,
                                 "images_apart": round((accuracy - stated) * images) if full
                                 else None}}


def check_uses(c: Campaign) -> dict:
    """The affine test set, predict and the routing figure on the device."""
    robust = c.work / "robustness"
    found = {"affine-test-set": Job("affine", c.capsnet(
        "robustness", str(SHIPPED), "--limit", str(c.profile.robustness_limit),
        "--max-angle", "30", "--step", "15", "--out-dir", str(robust)),
        c.profile.caps["check"]).run(c)}
    if (robust / "robustness.csv").is_file():
        found["affine-test-set"]["table"] = list(csv.DictReader(open(robust / "robustness.csv")))
    found["predict"] = Job("predict", c.capsnet("predict", str(c.work / "digit.png"), "--json",
                                                data=False), c.profile.caps["check"]).run(c)
    found["routing"] = Job("routing", c.capsnet("routing", "--index", "0", "1", "--out",
                                                str(c.work / "routing.png")),
                           c.profile.caps["check"]).run(c)
    return found


def record_checks(c: Campaign, found: dict) -> None:
    """Checks done: into health.json and the log at once."""
    c.write("health", checks={**c.records["health"]["checks"], **found})
    c.log("health: " + ", ".join(f"{name} " + ("ok" if check["ok"] else check.get("skipped")
                                               or "FAILED") for name, check in found.items()))


def health(c: Campaign) -> None:
    c.part_deadline = time.monotonic() + c.profile.caps["health"]
    shrink = map(str, c.profile.shrink or ())
    facts = Job("prepare", ["-m", "benchmarks.campaign_health", "prepare", c.args.device,
                            c.data_dir, str(c.work), *shrink], c.profile.caps["check"]).run(c)
    c.data_dir = facts.get("result", {}).get("data_dir", c.data_dir)
    c.write("health", device=facts.get("result", {}).get("device", facts), checks={})
    models = [("capsnet-fp32", "--precision", "fp32"), ("capsnet-bf16", "--precision", "bf16"),
              ("capsnet-fp16", "--precision", "fp16"), ("cnn", "--model", "cnn"),
              ("em", "--model", "em"), ("efficient", "--model", "efficient")]
    checks = [lambda: check_resume(c), lambda: check_uses(c), lambda: check_evaluate(c)]
    checks += [lambda m=m: check_training(c, *m, "--conv-impl", "native") for m in models]
    # the longest first (three jobs in turn); the out-of-memory run last and alone, as it
    # takes the GPU's memory
    pool = concurrent.futures.ThreadPoolExecutor(c.profile.concurrency)
    futures = [pool.submit(check) for check in checks]
    try:
        pending = set(futures)
        while pending and time.monotonic() < c.part_deadline + KILL_GRACE:
            finished, pending = concurrent.futures.wait(pending, timeout=0.5)
            for future in finished:
                found = future.result() if future.exception() is None else {
                    "error": {"ok": False, "error": repr(future.exception())}}
                record_checks(c, found)
    finally:
        pool.shutdown(wait=not c.stopping, cancel_futures=True)  # jobs end at the cap
    if not pending:
        with contextlib.suppress(OutOfTime):
            record_checks(c, check_out_of_memory(c))
    c.part_deadline = math.inf
    c.write("health", state="done" if not pending else "capped")


# ---------------------------------------------------------------------------- 2. epoch times


def epoch_record(job: Job, record: dict, run_dir: Path) -> dict:
    """The last epoch of a timed run: its training, validation and checkpoint seconds (the
    wall time between two epoch lines, less training and a re-save of last.pt), peak memory
    against the run's estimate."""
    curve, times = read_curve(run_dir), job.epoch_times()
    config = read_json(run_dir / "config.json") or {}
    result = record.get("result", {})
    found = {"ok": record["ok"], "seconds": record["seconds"], "timed_out": record["timed_out"],
             "plan": config.get("speed"), "epochs": curve, "tail": record["tail"]}
    if len(curve) >= 2 and len(times) >= 2:
        wall, train = times[-1] - times[-2], curve[-1]["epoch_seconds"]
        checkpoint = result.get("checkpoint_seconds", 0.0)
        found.update(epoch_wall_seconds=round(wall, 2), train_seconds=train,
                     first_train_seconds=curve[0]["epoch_seconds"],
                     checkpoint_seconds=checkpoint,
                     validation_seconds=round(max(0.0, wall - train - checkpoint), 2))
    estimate = config.get("memory_estimate_bytes")
    peak = result.get("cuda_peak_mib")
    found.update(peak_mib=peak, peak_rss_mib=result.get("peak_rss_mib"),
                 estimate_mib=round(estimate / 2**20, 1) if estimate else None)
    return found


def timed_run(c: Campaign, name: str, cap: float, *args: str, env: dict | None = None) -> Job:
    return Job(name, ["-m", "benchmarks.campaign_health", "run",
                      *c.train(c.work / name, "--epochs", "2", *c.profile.epoch_args, *args)[2:]],
               cap, env or {})


def epoch_times(c: Campaign) -> None:
    """fp32 then the automatic choice, one after the other; the automatic choice's epoch
    (validation and checkpoint included) is the gate's, else float32's."""
    found, c.part_deadline = {}, time.monotonic() + c.profile.caps["epochs"]
    for precision in ("fp32", "auto"):
        name = f"epochs-{precision}"
        job = timed_run(c, name, c.profile.caps["epoch_run"], "--precision", precision)
        found[precision] = epoch_record(job, job.run(c), c.work / name)
        c.write("bench", epochs=found)
    c.write("bench", state="epochs done")
    c.part_deadline = math.inf
    timed = next((found[p] for p in ("auto", "fp32") if "epoch_wall_seconds" in found[p]), {})
    c.epoch_seconds, c.train_seconds = timed.get("epoch_wall_seconds"), timed.get("train_seconds")


def compile_record(c: Campaign, job: Job | None) -> None:
    """The compiled run: epoch 1 less epoch 2 is the compile; epoch 2 the compiled speed."""
    if job is None:
        c.write("bench", compile={"ok": None, "skipped": "torch.compile is timed on a GPU"})
        return
    if job.proc.poll() is None:
        job.kill()
    found = epoch_record(job, job.wait(c), c.work / "compile")
    if "first_train_seconds" in found:
        found["compile_seconds"] = round(found["first_train_seconds"] - found["train_seconds"], 1)
    c.write("bench", compile=found)


# ---------------------------------------------------------------------------- 3. protocol


def protocol(c: Campaign) -> None:
    left, epoch_seconds = c.left() - c.profile.final, c.epoch_seconds
    gate = pick_recipe(epoch_seconds, left, c.profile.recipe_epochs, c.profile.protocol_fixed)
    root = c.work / "protocol"
    recipe = ("--recipe", gate["recipe"], "--epochs", str(gate["epochs"]),
              *c.profile.epoch_args)
    limit = ("--time-limit", str(int(left - c.profile.protocol_fixed)))
    c.log(f"protocol: {gate['recipe']} recipe, {gate['epochs']} epochs ({gate['why']})")
    c.write("protocol", gate={**gate, "epoch_seconds_alone": epoch_seconds,
                              "concurrent_slowdown_assumed": CONCURRENT_SLOWDOWN,
                              "seconds_left": round(left)})
    jobs = [Job(f"seed-{s}", c.train(root / f"seed-{s}", *recipe, "--seed", str(s), *limit),
                left).start(c) for s in SEEDS]
    while not all([job.done() for job in jobs]):  # snapshots: a kill still returns curves
        c.write("protocol", seeds=seed_records(root))
        archive(c)
        time.sleep(SNAPSHOT_SECONDS)
    runs = {job.name: job.wait(c) for job in jobs}
    unfinished = [s for s in SEEDS if not (read_json(root / f"seed-{s}" / "results.json") or {})
                  .get("complete") and (root / f"seed-{s}" / "last.pt").is_file()]
    finish = [Job(f"test-seed-{s}", c.capsnet("train", "--resume", str(root / f"seed-{s}"),
                                              "--epochs", str(len(read_curve(root / f"seed-{s}"))),
                                              "--no-progress"), c.profile.protocol_fixed)
              .start(c) for s in unfinished]  # tested where it stands
    runs.update({job.name: job.wait(c) for job in finish})
    seeds = seed_records(root)
    together = [row["epoch_seconds"] for s in seeds.values() for row in s["curve"][1:]]
    c.write("protocol", seeds=seeds, runs=runs, measured_slowdown=round(
        sum(together) / len(together) / c.train_seconds, 2) if together and c.train_seconds
        else None)
    if all(s["complete"] for s in seeds.values()):
        done = min(s["epochs"] for s in seeds.values())
        summary = Job("repeat", c.capsnet("repeat", "--seeds", ",".join(map(str, SEEDS)),
                                          "--out-dir", str(root), "--preset", c.profile.preset,
                                          *recipe[:2], "--epochs", str(done),
                                          *c.profile.epoch_args, "--no-progress"),
                      c.profile.protocol_fixed).run(c)
        c.write("protocol", repeat=summary, summary=read_json(root / "summary.json"))
    best = max(seeds, key=lambda s: seeds[s]["best_val_accuracy"] or -1.0, default=None)
    if best and (root / best / "best.pt").is_file():
        exported = Job("export-best", c.capsnet("export", str(root / best / "best.pt"),
                                                "--format", "safetensors", "-o",
                                                str(c.out / "paper-capsnet.safetensors"),
                                                data=False, device=""),
                       c.profile.protocol_fixed).run(c)
        c.write("protocol", weights={"seed": best, **exported})
    c.write("protocol", state="done")


def seed_records(root: Path) -> dict:
    """Each seed's curve and, once tested, its results (confusion matrices left out)."""
    found = {}
    for run_dir in sorted(root.glob("seed-*")):
        results = read_json(run_dir / "results.json") or {}
        found[run_dir.name] = {
            "complete": bool(results.get("complete")), "epochs": results.get("epochs"),
            "best_epoch": results.get("best_epoch"),
            "best_val_accuracy": results.get("best_val_accuracy"),
            "test": {k: {m: results[k][m] for m in ("accuracy", "error") if m in results[k]}
                     for k in ("best", "final") if isinstance(results.get(k), dict)},
            "curve": read_curve(run_dir)}
    return found


def archive(c: Campaign) -> None:
    """seeds.tar.gz: each seed's metrics, config, command, results and test scores, and the
    protocol's summary."""
    root = c.work / "protocol"
    names = ("metrics.csv", "config.json", "command.txt", "results.json", "test_scores.npy")
    files = [p for p in sorted(root.glob("seed-*/*")) if p.name in names]
    files += [p for p in [root / "summary.json"] if p.is_file()]
    if files:
        tmp = c.out / ".seeds.tar.gz.tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            for path in files:
                tar.add(path, arcname=str(path.relative_to(root)))
        os.replace(tmp, c.out / "seeds.tar.gz")


# ---------------------------------------------------------------------------- 4. benchmarks


def bench_cases(c: Campaign) -> None:
    left = c.left() - c.profile.final
    if left < c.profile.bench_min:
        c.write("bench", cases={"skipped": f"{left:.0f} s left"})
        return
    path = c.work / "cases.json"
    record = Job("bench", ["-m", "benchmarks.bench", "--device", c.args.device,
                           *c.profile.bench_args, "--json", str(path)], left).run(c)
    c.write("bench", cases={**record, "cases": read_json(path)})


# ---------------------------------------------------------------------------- command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("first", help="health, epoch times, the protocol, benchmarks",
                            description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=str(REPO / ".gpu-data" / "mnist"),
                   help="the four MNIST IDX files (never downloaded; default .gpu-data/mnist)")
    p.add_argument("--out", default=os.environ.get("OUT", "runs/first"),
                   help="the results: at most 8 files (default $OUT, else runs/first)")
    p.add_argument("--work", default=None,
                   help="run directories and checkpoints (default: a new temporary folder)")
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:1, cpu")
    p.add_argument("--minutes", type=float, default=None,
                   help=f"the whole command's budget (default {GPU.minutes:g}; --tiny "
                        f"{TINY.minutes:g})")
    p.add_argument("--tiny", action="store_true",
                   help="rehearse the same sequence in minutes on a CPU: small models, a few "
                        "hundred images, 2-3 epochs")
    args = parser.parse_args(argv)
    if not Path(args.data_dir).is_dir():
        parser.error(f"no MNIST in {args.data_dir}: put the four IDX files there")
    return args


def main(argv: list[str] | None = None) -> int:
    c = Campaign(parse_args(argv))
    signal.signal(signal.SIGTERM, c.on_signal)
    c.log(f"gpu_campaign first on {c.args.device}: budget {c.minutes:g} min, work {c.work}, "
          f"out {c.out}")
    code = 0
    try:
        c.zygote = Zygote(c)
        compile_job = timed_run(c, "compile", c.profile.caps["compile"], "--compile",
                                "--subset", str(ONE_SHAPE_SUBSET),
                                env={"CAPSNET_CACHE_DIR": str(c.work / "cache-compile")}
                                ).start(c) if c.gpu else None  # warms beside the health checks
        for part, step in (("health", lambda: health(c)), ("bench", lambda: epoch_times(c)),
                           ("bench", lambda: compile_record(c, compile_job)),
                           ("protocol", lambda: protocol(c)), ("bench", lambda: bench_cases(c))):
            try:
                step()
            except Exception as exc:  # a bug in one part leaves the others running
                c.log(f"{part}: {type(exc).__name__}: {exc}")
                c.write(part, state="incomplete", error=f"{type(exc).__name__}: {exc}")
        c.write("bench", state="done")
    except Stopped:
        c.log("SIGTERM: writing what is done")
        code = 143
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        c.stop_all()
        if c.zygote:
            c.zygote.close()
        for name, record in list(c.records.items()):
            if record["state"] != "done":
                c.write(name, state="interrupted" if code else record["state"])
        archive(c)
        problems = out_problems(c.out)
        c.log(f"done in {time.monotonic() - STARTED:.0f} s; --out: "
              + ("; ".join(problems) if problems else
                 ", ".join(sorted(p.name for p in c.out.iterdir()))))
    return code


if __name__ == "__main__":
    sys.exit(main())
