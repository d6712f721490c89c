"""The torch side of benchmarks/gpu_campaign.py: small jobs, each run in a process of its own.

    python -m benchmarks.campaign_health prepare cuda MNIST_DIR WORK [TRAIN TEST]
                          # the device's facts, a test digit as a PNG, a smaller MNIST copy
    python -m benchmarks.campaign_health run train --device cuda ...   # `capsnet ARGS`, then
                                      # the process's peak memory and a checkpoint's save time
    python -m benchmarks.campaign_health serve      # torch imported once, each job a fork

Each job ends with one line ``campaign-result: {json}`` that the campaign reads back.
``serve`` reads one JSON request a line on stdin ({"id", "argv", "env", "cwd", "fifo"}),
forks a process for it (its own session, its output into the named pipe ``fifo``) and
answers ``{"id", "pid"}``, then ``{"id", "rc"}`` when it ends: every job keeps a process of
its own, without paying for importing torch each time.
"""
from __future__ import annotations

import importlib.util
import json
import os
import resource
import runpy
import select
import sys
import time
import traceback
from pathlib import Path

RESULT_PREFIX = "campaign-result: "
MNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def device_facts(name: str) -> dict:
    """torch and CUDA versions, the GPU's name, capability, memory and 16-bit support, and
    whether the optional ONNX packages are installed."""
    import torch

    facts = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
             "cpu_cores": os.cpu_count(),
             **{package: importlib.util.find_spec(package) is not None
                for package in ("onnx", "onnxruntime")}}
    if name.startswith("cuda") and torch.cuda.is_available():
        device = torch.device(name)
        props = torch.cuda.get_device_properties(device)
        facts.update(name=props.name, capability=list(torch.cuda.get_device_capability(device)),
                     memory_gib=round(props.total_memory / 2**30, 1),
                     multiprocessors=props.multi_processor_count, cuda=torch.version.cuda,
                     cudnn=torch.backends.cudnn.version(), gpus=torch.cuda.device_count(),
                     bf16=torch.cuda.is_bf16_supported())
    return facts


def idx_path(directory: Path, stem: str) -> Path:
    """An IDX file stored raw or gzip-compressed."""
    raw = directory / stem
    return raw if raw.is_file() else directory / f"{stem}.gz"


def prepare(device: str, data_dir: str, work: str, train: str = "", test: str = "") -> dict:
    """The device's facts; the first MNIST test image as work/digit.png (for `capsnet
    predict`); with ``train`` and ``test``, the first that many training and test images as
    IDX files in work/mnist (a rehearsal on a CPU then tests on hundreds, not 10,000)."""
    from PIL import Image

    from capsnet.data.idx import read_idx, write_idx

    source, found = Path(data_dir), {"device": device_facts(device), "data_dir": data_dir}
    if train:
        found["data_dir"] = str(Path(work) / "mnist")
        Path(found["data_dir"]).mkdir(parents=True, exist_ok=True)
        for split, count in (("train", int(train)), ("test", int(test))):
            for stem in MNIST_FILES[split]:
                write_idx(Path(found["data_dir"]) / stem, read_idx(idx_path(source, stem))[:count])
    test_images = read_idx(idx_path(source, MNIST_FILES["test"][0]))  # (N, 28, 28) uint8
    Image.fromarray(test_images[0]).save(Path(work) / "digit.png")
    return found


def run_cli(*argv: str) -> dict:
    """``capsnet ARGV`` in this process; then its peak memory (CUDA: max allocated; always:
    peak resident set) and the seconds torch.save takes to write its run's last.pt again."""
    import torch

    from capsnet.cli.main import main

    started = time.perf_counter()
    code = main(list(argv))
    result = {"rc": code, "seconds": round(time.perf_counter() - started, 2),
              "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}
    if torch.cuda.is_initialized():
        result["cuda_peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    last = Path(argv[argv.index("--out-dir") + 1]) / "last.pt" if "--out-dir" in argv else None
    if last is not None and last.is_file():
        payload = torch.load(last, map_location="cpu", weights_only=False)
        start = time.perf_counter()
        torch.save(payload, last.with_suffix(".resave"))
        result["checkpoint_seconds"] = round(time.perf_counter() - start, 3)
        result["checkpoint_mib"] = round(last.stat().st_size / 2**20, 1)
        last.with_suffix(".resave").unlink()
    return result


def run_forked(request: dict) -> int:
    """In the forked process: its own session, output and environment; then the request's
    ``python ARGV`` (``-m MODULE ...``, ``-c CODE ...`` or ``SCRIPT ...``). Returns the
    exit status."""
    os.setsid()
    pipe = os.open(request["fifo"], os.O_WRONLY)
    os.dup2(pipe, 1)
    os.dup2(pipe, 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    import torch

    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    argv = request["argv"]
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # the job's failure, reported as its exit status
        traceback.print_exc()
        return 1


def serve() -> dict:
    """Fork one process per request line on stdin until stdin closes (see the docstring)."""
    import torch  # noqa: F401  (imported once, before any fork; CUDA is never touched here)

    import capsnet.cli.main  # noqa: F401

    if torch.cuda.is_initialized():  # a fork would inherit a CUDA context it cannot use
        return {"served": False, "why": "CUDA was initialised before the first fork"}
    children, pending = {}, b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.1)
        chunk = os.read(0, 65536) if ready else None  # unbuffered: no line waits in a buffer
        if chunk == b"":  # stdin closed: the campaign ended
            return {"served": True}
        pending += chunk or b""
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = run_forked(request)
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            children[pid] = request["id"]
            print(json.dumps({"id": request["id"], "pid": pid}), flush=True)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            print(json.dumps({"id": children.pop(pid), "rc": os.waitstatus_to_exitcode(status)}),
                  flush=True)


JOBS = {"prepare": prepare, "run": run_cli, "serve": serve}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in JOBS:
        print(f"usage: python -m benchmarks.campaign_health {{{','.join(JOBS)}}} ARGS...",
              file=sys.stderr)
        return 2
    result = JOBS[argv[0]](*argv[1:])
    print(RESULT_PREFIX + json.dumps(result), flush=True)
    return int(result.get("rc", 0) or 0)


if __name__ == "__main__":
    sys.exit(main())
