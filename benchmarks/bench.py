"""Training-step and inference speed of capsnet against a naive reference, in one run.

    python benchmarks/bench.py                 # CPU (or the GPU when present), batch 128
    python benchmarks/bench.py --device cpu --repeats 7

Each case runs in its own subprocess so that its peak memory is its own. Prints images/s,
the ratio to the reference, the convolutions' GFLOP/s against a large matmul timed in turns
with them, and peak memory (GPU: max allocated; CPU: peak resident set). Every case,
the reference included, runs under the same process settings (``tune_backends``: heap
reuse on the CPU unless ``--default-allocator``). On the CPU the "-onednn" cases swap
PrimaryCaps' GEMM convolution for a plain ``nn.Conv2d`` to show what that path gains.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capsnet.config import CapsNetConfig  # noqa: E402
from capsnet.devices import pick_device, tune_backends  # noqa: E402


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn, device, warmup: int, repeats: int) -> float:
    return interleaved_medians([fn], device, warmup, repeats)[0]


def conv_flops(cfg: CapsNetConfig, batch: int) -> dict:
    """Multiply-adds x 2 of Conv1 and the PrimaryCaps convolution, forward and training
    (forward + weight gradient, + input gradient for PrimaryCaps)."""
    conv1 = 2 * batch * cfg.conv1_channels * cfg.conv1_grid**2 * cfg.in_channels * cfg.conv1_kernel**2
    primary = (2 * batch * cfg.primary_types * cfg.primary_dim * cfg.primary_grid**2
               * cfg.conv1_channels * cfg.primary_kernel**2)
    return {"forward": conv1 + primary, "train": 2 * conv1 + 3 * primary}


def matmul_operands(device) -> tuple[torch.Tensor, torch.Tensor]:
    n = 2048 if device.type == "cpu" else 8192
    return torch.randn(n, n, device=device), torch.randn(n, n, device=device)


def interleaved_medians(fns, device, warmup: int, repeats: int) -> list[float]:
    """Median seconds of each function, timed in turns (a, b, a, b, ...) so that a host
    whose speed drifts during the run shifts all of them alike."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, seconds in zip(fns, times):
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            seconds.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def use_plain_primary_conv(model) -> None:
    """Swap PrimaryCaps' GEMM convolution for a plain nn.Conv2d (oneDNN on the CPU) with the
    same weights: the "-onednn" cases, to show what the GEMM path gains."""
    gemm_conv = model.primary_caps.conv
    plain = torch.nn.Conv2d(gemm_conv.in_channels, gemm_conv.out_channels,
                            gemm_conv.kernel_size, stride=gemm_conv.stride)
    plain.load_state_dict(gemm_conv.state_dict())
    model.primary_caps.conv = plain.to(gemm_conv.weight.device)


def build(case: str, device):
    """(model, step(x, y) for training, infer(x)) for a case name."""
    from capsnet.losses import model_loss
    from capsnet.models import CapsNet
    from benchmarks.naive_reference import NaiveCapsNet

    if case.startswith("naive"):
        model = NaiveCapsNet().to(device)

        def forward_loss(x, y):
            onehot = torch.nn.functional.one_hot(y, 10).float()
            lengths, recon = model(x, onehot)
            return model.loss(x, lengths, onehot, recon)

        def infer(x):
            onehot = torch.nn.functional.one_hot(torch.zeros(len(x), dtype=torch.long,
                                                             device=device), 10).float()
            return model(x, onehot)
    else:
        model = CapsNet().to(device)
        if "onednn" in case:
            use_plain_primary_conv(model)
        fwd = torch.compile(model) if "compile" in case else model
        amp = torch.autocast(device.type, torch.bfloat16) if "bf16" in case else None

        def forward_loss(x, y):
            with amp if amp is not None else torch.autocast(device.type, enabled=False):
                return model_loss(fwd(x, y), x, y)

        def infer(x):
            with amp if amp is not None else torch.autocast(device.type, enabled=False):
                return fwd(x)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(x, y):
        loss = forward_loss(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return model, step, infer


def run_case(case: str, args) -> dict:
    """Measure one case in this process and return its numbers."""
    device = pick_device(args.device)
    tune_backends(device, reuse_freed_memory=not args.default_allocator)
    torch.manual_seed(0)
    x = torch.rand(args.batch_size, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)
    if case.startswith("convs"):
        return conv_gflops(x, device, args, plain="onednn" in case)
    model, step, infer = build(case, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    train_s = median_seconds(lambda: step(x, y), device, args.warmup, args.repeats)
    model.eval()
    with torch.no_grad():
        infer_s = median_seconds(lambda: infer(x), device, args.warmup, args.repeats)
    return {"train_images_per_s": args.batch_size / train_s,
            "infer_images_per_s": args.batch_size / infer_s,
            "peak_mb": peak_memory_mb(device)}


def conv_gflops(x, device, args, plain: bool = False) -> dict:
    """GFLOP/s of capsnet's Conv1 + PrimaryCaps convolution, forward and backward, and of
    a square matmul timed in turns with them (the yardstick)."""
    from capsnet.models import CapsNet

    model = CapsNet().to(device)
    if plain:
        use_plain_primary_conv(model)
    convs = [model.conv1, model.primary_caps.conv]
    a, b = matmul_operands(device)

    def fwd_bwd():
        h = convs[1](convs[0](x))  # the two convolutions alone (the ReLU is no convolution)
        h.sum().backward()

    conv_s, matmul_s = interleaved_medians([fwd_bwd, lambda: a @ b], device,
                                           args.warmup, 2 * args.repeats)
    return {"gflops": conv_flops(model.config, len(x))["train"] / conv_s / 1e9,
            "matmul_gflops": 2 * a.shape[0] ** 3 / matmul_s / 1e9}


def peak_memory_mb(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def cases_for(device: torch.device, skip_reference: bool) -> list[str]:
    cases = ["convs"] + ([] if skip_reference else ["naive"]) + ["capsnet"]
    if device.type == "cpu":
        cases = ["convs-onednn"] + cases + ["capsnet-onednn"]
    if device.type == "cuda":
        cases += ["capsnet-bf16", "capsnet-compile", "capsnet-compile-bf16"]
    return cases


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--cases", default=None, help="comma-separated subset of cases")
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)  # child process
    parser.add_argument("--json", default=None, help="also write the results to this file")
    parser.add_argument("--default-allocator", action="store_true",
                        help="leave glibc malloc as it is (no heap reuse) in every case")
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(args.case, args)))
        return 0
    device = pick_device(args.device)
    cases = args.cases.split(",") if args.cases else cases_for(device, args.skip_reference)
    results = {}
    for case in cases:
        child = [sys.executable, __file__, "--case", case, "--device", str(device),
                 "--batch-size", str(args.batch_size), "--warmup", str(args.warmup),
                 "--repeats", str(args.repeats)] + (
                     ["--default-allocator"] if args.default_allocator else [])
        out = subprocess.run(child, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{case}: failed\n{out.stderr.strip().splitlines()[-1]}", file=sys.stderr)
            continue
        results[case] = json.loads(out.stdout.strip().splitlines()[-1])
    print_table(results, device, args.batch_size)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def print_table(results: dict, device, batch: int) -> None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (
        f"CPU, {torch.get_num_threads()} threads")
    print(f"device: {name}; torch {torch.__version__}; batch {batch}")
    for case in ("convs", "convs-onednn"):
        if case in results:
            cv, mm = results[case]["gflops"], results[case]["matmul_gflops"]
            label = "capsnet's" if case == "convs" else "with a plain nn.Conv2d PrimaryCaps,"
            print(f"{label} convolutions (fwd+bwd) {cv:.0f} GFLOP/s = {100 * cv / mm:.0f}% of "
                  f"a {mm:.0f} GFLOP/s matmul timed in turns with them")
    ref = results.get("naive")
    print(f"{'case':<22}{'train img/s':>12}{'x ref':>8}{'infer img/s':>13}{'x ref':>8}{'peak MB':>10}")
    for case, r in results.items():
        if "train_images_per_s" not in r:
            continue
        tr = f"{r['train_images_per_s'] / ref['train_images_per_s']:.2f}" if ref else "-"
        inf = f"{r['infer_images_per_s'] / ref['infer_images_per_s']:.2f}" if ref else "-"
        print(f"{case:<22}{r['train_images_per_s']:>12.1f}{tr:>8}"
              f"{r['infer_images_per_s']:>13.1f}{inf:>8}{r['peak_mb']:>10.0f}")


if __name__ == "__main__":
    sys.exit(main())
