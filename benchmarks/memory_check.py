"""Peak memory of whole training steps at the full batch, counted by live tensors (a run's
own figure is read after its first step: capsnet.tuning.measure_step_memory).

    python -m benchmarks.memory_check              # the table of docs/gpu.md (CPU)

The peak is the most bytes held at once by live tensors of the step's device (CPU here):
every tensor an operator creates is counted from its creation until its storage is freed
(a ``TorchDispatchMode`` sees each operator's outputs; a weak reference on each new storage
sees it go), on top of what existed before (parameters, the batch). This is what torch's
CUDA allocator reports as ``max_memory_allocated`` on a GPU, without the allocator's
rounding; the CPU has no allocator statistics of its own. On a GPU the same check runs with
``torch.cuda.max_memory_allocated``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from capsnet.models.sizing import LiveBytes

MIB = 2**20


def measured_peak(config, batch_size: int, precision: str = "fp32",
                  impl: str | dict[str, str] = "gemm", steps: int = 2) -> int:
    """Peak bytes of live CPU tensors over the last of ``steps`` training steps of a fresh
    model (as capsnet's loop runs them: forward, zero_grad, backward, Adam), counting the
    parameters and the batch. ``impl``: every convolution's implementation, or a plan's
    (layer -> implementation)."""
    from capsnet.losses import model_loss
    from capsnet.models import build_model
    from capsnet.tuning import SpeedPlan, apply_plan, conv_layers

    torch.manual_seed(0)
    model = build_model(config)
    impls = impl if isinstance(impl, dict) else {name: impl for name, _ in conv_layers(model)}
    apply_plan(model, SpeedPlan(precision, impls))
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.rand(batch_size, config.in_channels, config.image_size, config.image_size)
    y = torch.randint(0, config.num_classes, (batch_size,))
    before = sum(p.numel() * p.element_size() for p in model.parameters()) \
        + x.numel() * x.element_size()
    live = LiveBytes()  # the estimate's counter, on real tensors
    with live:
        for _ in range(steps):
            live.reset()  # the last step's peak, Adam's state already made
            loss = model_loss(model(x, y), x, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            del loss
            optimizer.step()
    return before + live.peak


def resident_peak(config, batch_size: int, precision: str = "fp32", impl: str = "gemm",
                  steps: int = 2) -> int | None:
    """The same steps' peak as the operating system sees it, for comparison: the growth of
    this process's peak resident set over the steps (VmHWM, reset through clear_refs; glibc
    returns large blocks at once) plus the parameters and the batch. It counts what live
    tensors do not: oneDNN's scratch memory, the allocator's slack. Run it in a fresh
    process; None where /proc does not offer it."""
    import subprocess

    code = (f"import json, torch, benchmarks.memory_check as m; from capsnet.models import "
            f"config_from_dict as c; print(m._resident_peak_here(c({_name(config)!r}, "
            f"json.loads({_json(config)!r})), {batch_size}, {precision!r}, {impl!r}, {steps}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(Path(__file__).resolve().parents[1]))
    return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else None


def _name(config) -> str:
    from capsnet.models import model_name_of

    return model_name_of(config)


def _json(config) -> str:
    import json

    from capsnet.config import config_to_dict

    return json.dumps(config_to_dict(config))


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(field)


def _resident_peak_here(config, batch_size, precision, impl, steps) -> int:
    from capsnet.losses import model_loss
    from capsnet.models import build_model
    from capsnet.tuning import SpeedPlan, apply_plan, conv_layers

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model(config)
    apply_plan(model, SpeedPlan(precision, {name: impl for name, _ in conv_layers(model)}))
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.rand(batch_size, config.in_channels, config.image_size, config.image_size)
    y = torch.randint(0, config.num_classes, (batch_size,))
    before = sum(p.numel() * p.element_size() for p in model.parameters()) \
        + x.numel() * x.element_size()
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident set starts again here
    start = _status_kib("VmRSS")
    for _ in range(steps):
        loss = model_loss(model(x, y), x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        del loss
        optimizer.step()
    return before + 1024 * (_status_kib("VmHWM") - start)


CHECKS = (("paper", "capsnet", {}),
          ("paper 32x32 RGB", "capsnet", {"image_size": 32, "in_channels": 3}),
          ("small", "capsnet", {}), ("half", "capsnet", {"image_size": 40}),
          ("cifar10", "capsnet", {"image_size": 24, "in_channels": 3}),
          ("svhn", "capsnet", {"image_size": 32, "in_channels": 3}),
          ("small", "cnn", {}), ("paper", "cnn", {}),
          ("paper 40x40 (affNIST)", "cnn", {"image_size": 40}))


def main(argv=None) -> int:
    from capsnet.models import make_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="16,128")
    parser.add_argument("--paths", default="fp32:gemm,bf16:gemm,fp32:native,bf16:native",
                        help="precision:implementation pairs")
    parser.add_argument("--rss", action="store_true",
                        help="also the peak resident set of each case in a process of its own")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("| model | precision, path | batch | measured MiB (live tensors) |"
          + (" peak RSS growth MiB |" if args.rss else ""))
    print("| --- | --- | ---: | ---: |" + (" ---: |" if args.rss else ""))
    for label, model, overrides in CHECKS:
        config = make_config(model, label.split()[0], **overrides)
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            for precision, impl in (pair.split(":") for pair in args.paths.split(",")):
                measured = measured_peak(config, batch, precision, impl)
                row = f"| {model} {label} | {precision} {impl} | {batch} | {measured / MIB:,.0f} |"
                if args.rss:
                    rss = resident_peak(config, batch, precision, impl)
                    row += f" {'-' if rss is None else f'{rss / MIB:,.0f}'} |"
                print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
