"""Adversarial training with `capsnet train` as it is, until the training loop takes an
`--adversarial` setting: every training batch is replaced by adversarial images of the
model being trained (capsnet.attacks.training.adversarial_batch), through the function
that makes the training batch (capsnet.training.loop.classification_batch). Validation and
test stay on clean images; the checkpoint is an ordinary one (`capsnet attack` reads it).

    python -m benchmarks.adversarial_train --kind fgsm-rs --eps 0.3 -- \\
        --model cnn --preset tiny --recipe fast --epochs 10 --out-dir runs/adv/cnn-fgsm-rs
"""
from __future__ import annotations

import argparse

from capsnet.attacks.training import ADVERSARIAL_KINDS, adversarial_batch
from capsnet.cli.main import main as capsnet_main
from capsnet.training import fit, loop


def adversarial_batches(kind: str, eps: float, steps: int):
    """classification_batch with each batch made adversarial (``kind``, ``eps``, ``steps``)."""
    def classification_batch(model, images, labels, options, generator=None):
        clean = loop.classification_batch(model, images, labels, options, generator)

        def make_batch(idx):
            x, y = clean(idx)  # (B, C, H, W), (B,)
            return adversarial_batch(model, x, y, kind, eps, steps, generator=generator), y
        return make_batch
    return classification_batch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", choices=ADVERSARIAL_KINDS, required=True)
    p.add_argument("--eps", type=float, required=True, help="L-inf radius, pixels in [0, 1]")
    p.add_argument("--steps", type=int, default=10, help="PGD's steps (fgsm-rs: one)")
    p.add_argument("train_args", nargs=argparse.REMAINDER,
                   help="-- then the arguments of `capsnet train`")
    args = p.parse_args(argv)
    train_args = [a for a in args.train_args if a != "--"]
    fit.classification_batch = adversarial_batches(args.kind, args.eps, args.steps)
    return capsnet_main(["train", *train_args])


if __name__ == "__main__":
    raise SystemExit(main())
