"""The fused squash against autograd's, in one run: forward + backward of squash alone at
the paper model's shapes, and the paper model's training step (forward, margin and
reconstruction loss, backward) with each, timed in interleaved rounds.

    python -m benchmarks.squash_speed --batch-size 128 --rounds 5
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import capsnet.layers.primary_caps
import capsnet.routing.dynamic
from capsnet.devices import cpu_info
from capsnet.losses import capsule_loss
from capsnet.models.capsnet import CapsNet, CapsNetConfig
from capsnet.squashing import squash

PATCHED = (capsnet.layers.primary_caps, capsnet.routing.dynamic)  # the modules that call squash


def autograd_squash(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """REFERENCE ONLY: squash as capsnet wrote it before the fused Function, its gradient
    left to autograd."""
    scale = s.detach().abs().amax(dim=dim, keepdim=True).clamp_min(torch.finfo(s.dtype).tiny)
    t = s / scale
    t_norm = torch.sqrt(t.pow(2).sum(dim=dim, keepdim=True) + 1e-12)
    n2 = (scale * t_norm).pow(2)
    short = n2 < 1
    factor = torch.where(short, n2 / (1 + n2.masked_fill(~short, 0)), 1 - 1 / (1 + n2))
    return t / t_norm * factor


def seconds(fn, inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--inner", type=int, default=3, help="steps a round (squash: x20)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    B = args.batch_size
    model = CapsNet(CapsNetConfig())  # the paper model, float32, capsnet's CPU convolution
    images, labels = torch.rand(B, 1, 28, 28), torch.randint(0, 10, (B,))
    shapes = [(B, 1152, 8), (B, 10, 16)]  # PrimaryCaps, each routing iteration
    inputs = [torch.randn(shape, requires_grad=True) for shape in shapes]

    def squash_alone(fn):
        for s in inputs:
            fn(s).sum().backward()

    def step(fn):
        for module in PATCHED:
            module.squash = fn
        model.zero_grad(set_to_none=True)
        capsule_loss(model(images, labels), images, labels).backward()

    cases = {"autograd": autograd_squash, "fused": squash}
    times = {f"{part} {name}": [] for part in ("squash", "step") for name in cases}
    for fn in cases.values():  # warm-up
        step(fn)
        squash_alone(fn)
    for _ in range(args.rounds):
        for name, fn in cases.items():
            times[f"squash {name}"].append(seconds(lambda fn=fn: squash_alone(fn), 20 * args.inner))
            times[f"step {name}"].append(seconds(lambda fn=fn: step(fn), args.inner))
    for module in PATCHED:
        module.squash = squash
    model_name = cpu_info()[0]
    print(f"CPU: {model_name}, {torch.get_num_threads()} threads, torch {torch.__version__}, "
          f"batch {B}, {args.rounds} rounds (median)")
    for part in ("squash", "step"):
        old, new = (statistics.median(times[f"{part} {n}"]) for n in cases)
        print(f"{part:6s} autograd {old * 1e3:8.2f} ms  fused {new * 1e3:8.2f} ms  "
              f"x{old / new:.2f}")


if __name__ == "__main__":
    main()
