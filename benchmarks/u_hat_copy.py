"""The paper CapsNet's training step with and without the copy of u_hat (issue 44), timed in
one run, alternating, on 1 thread:

    python -m benchmarks.u_hat_copy [--batch 32] [--repeats 7]

Prints the median seconds per step of each and their ratio (copy / view)."""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from capsnet import create_model
from capsnet.layers import CapsuleLayer
from capsnet.losses import margin_loss


def copied_predictions(layer: CapsuleLayer, u: torch.Tensor) -> torch.Tensor:
    """The old DigitCaps.predictions: the einsum's result copied into (B, J, I, D) order."""
    return torch.einsum("ijdk,bik->bjid", layer.W, u).contiguous()


def step_seconds(model, images, labels) -> float:
    start = time.perf_counter()
    out = model(images, labels)
    margin_loss(out.scores, labels).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = create_model("capsnet")
    images, labels = torch.rand(args.batch, 1, 28, 28), torch.randint(0, 10, (args.batch,))
    layer = model.digit_caps
    view = layer.predictions
    times = {"copy": [], "view": []}
    for r in range(args.repeats + 1):
        for name in times:
            layer.predictions = (view if name == "view"
                                 else lambda u: copied_predictions(layer, u))
            seconds = step_seconds(model, images, labels)
            if r:  # the first round warms up
                times[name].append(seconds)
    median = {name: statistics.median(t) for name, t in times.items()}
    print(f"batch {args.batch}, 1 thread, median of {args.repeats}: copy {median['copy']:.3f} s, "
          f"view {median['view']:.3f} s, copy/view {median['copy'] / median['view']:.2f}")


if __name__ == "__main__":
    main()
