"""Training-step and inference speed of capsnet against public styles of CapsNet, in one run.

    python -m benchmarks.bench                  # CPU (or the GPU when present), batch 128
    python -m benchmarks.bench --repeats 7 --cases capsnet,broadcast-style

Every case runs in a process of its own (no shared heap; its own peak memory), and the
processes are timed in interleaved rounds (a, b, c, a, b, c, ...: one call each per
round), so that a host whose speed drifts shifts them all alike and the ratios hold. The
cases:

- ``seed-style``: the naive reference (benchmarks/naive_reference.py): W copied per
  example before a broadcast matmul, routing on expanded tensors, eight stacked convs;
- ``broadcast-style``: written the way danielhavir/capsule-network writes it
  (benchmarks/broadcast_reference.py): one broadcast matmul of W, detached routing;
- ``capsnet``: what ``capsnet train`` runs with its defaults: the rule's plan for this
  machine (bf16 where it computes bf16 natively, GEMM convolutions on a CPU, cuDNN on a GPU;
  ``capsnet.tuning``);
- ``capsnet-<precision>-<path>``: capsnet forced to one precision and one convolution path;
- on GPUs, ``capsnet-compile``: the rule's plan under ``torch.compile``; on request
  (``--cases``), ``capsnet-cudagraphs``: the same compiled with CUDA graphs
  (``mode="reduce-overhead"``).

It prints the CPU model and flags (or the GPU), the rule's plan, images/s for a training
step (forward, backward, Adam) and for inference, ratios against both references and
against the fastest forced path, and each case's peak memory (GPU: max allocated; CPU:
peak resident set of its process). Every case runs under the same process settings
(``tune_backends``: heap reuse on the CPU unless ``--default-allocator``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from capsnet.devices import cpu_info, native_bf16, pick_device, synchronize, tune_backends
from capsnet.layers.gemm_conv import CONV_IMPLS
from capsnet.models.base import PRECISIONS
from capsnet.tuning import SpeedPlan, apply_plan, choose_plan, conv_layers

REPO = Path(__file__).resolve().parents[1]  # the workers run `python -m benchmarks.bench` here
REFERENCES = ("seed-style", "broadcast-style")
# torch.compile modes of the compiled cases; 'reduce-overhead' replays CUDA graphs (GPU only,
# not among cases_for's defaults: asked for by --cases)
COMPILE_MODES = {"compile": "default", "cudagraphs": "reduce-overhead"}
SHOWN_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")



def wall_clock(fn, device, inner: int) -> float:
    """Seconds per call of ``fn`` over ``inner`` calls, by the host clock."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / inner

def case_precisions(device_type: str, low: list[str]) -> list[str]:
    """The precisions a device's forced cases run in: on a CPU float32 and bf16 (emulated
    where not native, to show what it costs); on a GPU float32 and its native 16-bit
    precision ``low`` (bf16 from sm_80, fp16 on V100/T4: no bf16 cases a GPU emulates)."""
    if device_type == "cpu":
        return ["fp32", "bf16"]
    if device_type == "cuda":
        return ["fp32", *low]
    return ["fp32"]


def cases_for(device: torch.device, skip_reference: bool = False) -> list[str]:
    """Every case this device runs: the references, the default, each forced path."""
    cases = [] if skip_reference else list(REFERENCES)
    cases.append("capsnet")
    impls = CONV_IMPLS if device.type == "cpu" else CONV_IMPLS[1:]
    precisions = case_precisions(device.type, ["bf16"] if native_bf16(device) else [])
    cases += [f"capsnet-{p}-{impl}" for p in precisions for impl in impls]
    if device.type == "cuda":
        cases.append("capsnet-compile")
    return cases


def plan_for_case(case: str, model, device: torch.device, batch: int) -> SpeedPlan:
    """The rule's plan for 'capsnet' (and its compiled cases); the forced one otherwise."""
    parts = case.split("-")
    if len(parts) == 3 and parts[1] in PRECISIONS:
        precision, impl = parts[1], "-".join(parts[2:])
        return SpeedPlan(precision, {name: impl for name, _ in conv_layers(model)})
    return choose_plan(model, device)


def build(case: str, device: torch.device, batch: int):
    """(step() for training, infer() for inference, plan or None) of a case, on fixed inputs."""
    from benchmarks.broadcast_reference import BroadcastCapsNet
    from benchmarks.naive_reference import NaiveCapsNet
    from capsnet.losses import model_loss
    from capsnet.models import CapsNet

    torch.manual_seed(0)
    x = torch.rand(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    onehot = torch.nn.functional.one_hot(y, 10).float()
    plan = None
    if case == "seed-style":
        model = NaiveCapsNet().to(device)

        def forward_loss():
            lengths, recon = model(x, onehot)
            return model.loss(x, lengths, onehot, recon)

        def infer():
            return model(x, onehot)
    elif case == "broadcast-style":
        model = BroadcastCapsNet().to(device)

        def forward_loss():
            return model.loss(x, onehot, *model(x))

        def infer():
            return model(x)
    else:
        model = CapsNet().to(device)
        plan = plan_for_case(case, model, device, batch)
        apply_plan(model, plan)
        mode = COMPILE_MODES.get(case.removeprefix("capsnet-"))
        run = model if mode is None else torch.compile(model, mode=mode)

        def forward_loss():
            if case == "capsnet-cudagraphs":  # a new step: earlier graph outputs may be reused
                torch.compiler.cudagraph_mark_step_begin()
            return model_loss(run(x, y), x, y)

        def infer():
            return run(x)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        model.train()
        loss = forward_loss()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    @torch.no_grad()
    def inference():
        model.eval()
        infer()

    return step, inference, plan


def time_cases(cases: list[str], args, device: torch.device) -> dict:
    """Seconds per training step and per inference batch of every case, timed in
    interleaved rounds, each case in a process of its own (:class:`CaseWorker`); then each
    case's peak memory. ``args`` holds batch_size, warmup, repeats (and optionally
    default_allocator)."""
    workers = {case: CaseWorker(case, args, device) for case in cases}
    try:
        results = {}
        for kind in ("train", "infer"):
            for _ in range(args.warmup):
                for worker in workers.values():
                    worker.ask(kind)
            times: dict[str, list[float]] = {case: [] for case in cases}
            for _ in range(args.repeats):
                for case, worker in workers.items():  # a, b, c, a, b, c, ...
                    times[case].append(float(worker.ask(kind)))
            for case in cases:
                results.setdefault(case, {})[f"{kind}_images_per_s"] = (
                    args.batch_size / statistics.median(times[case]))
        for case, worker in workers.items():
            results[case]["plan"] = json.loads(worker.ask("plan"))
            results[case]["peak_mb"] = float(worker.ask("memory"))
        return results
    finally:
        for worker in workers.values():
            worker.close()


class CaseWorker:
    """One case in a process of its own that times one call at a time on request: cases
    are timed in turns without sharing a heap, and each has its own peak memory."""

    def __init__(self, case: str, args, device: torch.device):
        self.case = case
        command = [sys.executable, "-m", "benchmarks.bench", "--worker", case,
                   "--device", str(device), "--batch-size", str(args.batch_size)]
        if getattr(args, "default_allocator", False):
            command.append("--default-allocator")
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, cwd=REPO)
        # one case built (and its plan measured) at a time: nothing else runs meanwhile
        self._answer()

    def _answer(self) -> str:
        answer = self.process.stdout.readline()
        if not answer:
            error = self.process.stderr.read().strip().splitlines()
            raise RuntimeError(f"bench case {self.case} failed: "
                               f"{error[-1] if error else 'no output'}")
        return answer.strip()

    def ask(self, request: str) -> str:
        """Send one request ('train', 'infer', 'plan', 'memory'); the worker's one-line answer."""
        self.process.stdin.write(request + "\n")
        self.process.stdin.flush()
        return self._answer()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait()


def serve_case(case: str, args, device: torch.device) -> None:
    """The worker's side: build the case, then answer requests from stdin until it closes."""
    step, inference, plan = build(case, device, args.batch_size)
    print("ready", flush=True)
    calls = {"train": step, "infer": inference}
    for request in sys.stdin:
        request = request.strip()
        if request in calls:
            answer = repr(wall_clock(calls[request], device, inner=1))
        elif request == "plan":
            answer = json.dumps(plan.as_dict() if plan else None)
        elif request == "memory":
            answer = repr(peak_memory_mb(device))
        else:
            raise ValueError(f"unknown request {request!r}")
        print(answer, flush=True)


def peak_memory_mb(device: torch.device) -> float:
    """This process's peak memory: GPU max allocated, else the peak resident set."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_resident_mb()


def peak_resident_mb() -> float:
    """This process's peak resident set: VmHWM, which (unlike getrusage's ru_maxrss) does
    not inherit the peak of the process that started it."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"GPU {torch.cuda.get_device_name(device)} (sm_{major}{minor})"
    model, flags = cpu_info()
    shown = [f for f in SHOWN_CPU_FLAGS if f in flags]
    return (f"CPU {model} ({', '.join(shown) or 'no AVX flags read'}), "
            f"{torch.get_num_threads()} threads")


def print_table(results: dict, device: torch.device, batch: int) -> None:
    print(f"device: {describe_device(device)}; native bf16: {native_bf16(device)}; "
          f"torch {torch.__version__}; batch {batch}")
    plan = results.get("capsnet", {}).get("plan")
    if plan:
        print(f"capsnet's plan: {SpeedPlan.from_dict(plan).describe()}")
    refs = {r: results[r] for r in REFERENCES if r in results}
    forced = [r for c, r in results.items() if c.count("-") >= 2 and c.startswith("capsnet-")]
    best_forced = max((r["train_images_per_s"] for r in forced), default=None)
    ratios = "".join(f"{'x ' + r[:4]:>9}" for r in refs)
    header = f"{'case':<28}{'train img/s':>12}" + ratios
    header += f"{'x best path':>12}{'infer img/s':>13}" + ratios
    if any("peak_mb" in r for r in results.values()):
        header += f"{'peak MB':>9}"
    print(header)
    for case, r in results.items():
        line = f"{case:<28}{r['train_images_per_s']:>12.1f}"
        line += "".join(f"{r['train_images_per_s'] / ref['train_images_per_s']:>9.2f}"
                        for ref in refs.values())
        line += f"{r['train_images_per_s'] / best_forced:>12.2f}" if best_forced else f"{'-':>12}"
        line += f"{r['infer_images_per_s']:>13.1f}"
        line += "".join(f"{r['infer_images_per_s'] / ref['infer_images_per_s']:>9.2f}"
                        for ref in refs.values())
        if "peak_mb" in r:
            line += f"{r['peak_mb']:>9.0f}"
        print(line)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--cases", default=None, help="comma-separated subset of cases")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # one case's process
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--default-allocator", action="store_true",
                        help="leave glibc malloc as it is (no heap reuse) in every case")
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    tune_backends(device, reuse_freed_memory=not args.default_allocator)
    if args.worker:
        serve_case(args.worker, args, device)
        return 0
    cases = args.cases.split(",") if args.cases else cases_for(device, args.skip_reference)
    results = time_cases(cases, args, device)
    print_table(results, device, args.batch_size)
    if args.json:
        record = {"device": describe_device(device), "batch": args.batch_size,
                  "torch": str(torch.__version__), "cases": results}
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
