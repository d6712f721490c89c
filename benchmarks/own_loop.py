"""A model from ``capsnet.create_model`` in a plain training loop of your own: seconds per
step of the bare module (float32, PyTorch's convolutions) against the same module after
``capsnet.tune(model)`` (what ``capsnet train`` does to it), in one process.

    python -m benchmarks.own_loop                     # the paper CapsNet, batch 64

Both sides run in this one process, bare first (``tune`` changes process settings that are
not undone), on random images: only the ratio is the result."""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import capsnet
from capsnet.devices import machine_description
from capsnet.losses import model_loss


def seconds_per_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, warmup: int,
                     steps: int) -> float:
    """Median seconds of ``steps`` Adam steps (forward, loss, backward, step) after ``warmup``."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        loss = model_loss(model(x, y), x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="capsnet", help="a create_model name (default: capsnet)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    model = capsnet.create_model(args.model).train()
    cfg = model.config
    x = torch.rand(args.batch_size, cfg.in_channels, cfg.image_size, cfg.image_size)
    y = torch.randint(0, cfg.num_classes, (args.batch_size,))
    bare = seconds_per_step(model, x, y, args.warmup, args.steps)
    plan = capsnet.tune(model)
    tuned = seconds_per_step(model, x, y, args.warmup, args.steps)
    print(f"{args.model}, batch {args.batch_size}, {torch.get_num_threads()} threads, "
          f"{machine_description(torch.device('cpu')).get('name', 'CPU')}")
    print(f"bare module: {bare:.2f} s/step; after capsnet.tune ({plan.describe()}): "
          f"{tuned:.2f} s/step; {bare / tuned:.2f}x")


if __name__ == "__main__":
    main()
