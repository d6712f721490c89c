"""Adversarial training with `capsnet train` as it is, until the training loop takes an
`--adversarial` setting: every training batch is replaced by adversarial images of the
model being trained (capsnet.attacks.training.adversarial_batch), through the
``batch_loss`` argument of capsnet.training.loop.train_one_epoch. Validation and test stay
on clean images; the checkpoint is an ordinary one (`capsnet attack` reads it).

    python -m benchmarks.adversarial_train --kind fgsm-rs --eps 0.3 -- \\
        --model cnn --preset tiny --recipe fast --epochs 10 --out-dir runs/adv/cnn-fgsm-rs
"""
from __future__ import annotations

import argparse

from capsnet.attacks.training import ADVERSARIAL_KINDS, adversarial_batch
from capsnet.cli.main import main as capsnet_main
from capsnet.data.image_dataset import to_model_input
from capsnet.losses import model_loss
from capsnet.models import class_scores
from capsnet.training import fit, loop


def adversarial_epochs(kind: str, eps: float, steps: int):
    """train_one_epoch with each batch made adversarial (``kind``, ``eps``, ``steps``)."""
    def train_one_epoch(model, optimizer, images, labels, order, options, generator=None,
                        on_progress=None, batch_loss=None):
        def adversarial_loss(idx, run_fraction):
            x = loop.augment(to_model_input(images[idx]), options, generator)  # (B, C, H, W)
            y = labels[idx]  # (B,)
            x = adversarial_batch(model, x, y, kind, eps, steps, generator=generator)
            out = model(x, y)
            loss = model_loss(out, x, y, options.reconstruction_weight,
                              run_fraction=run_fraction)
            return loss, (class_scores(out).argmax(-1) == y).sum()
        return loop.train_one_epoch(model, optimizer, images, labels, order, options,
                                    generator, on_progress, adversarial_loss)
    return train_one_epoch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kind", choices=ADVERSARIAL_KINDS, required=True)
    p.add_argument("--eps", type=float, required=True, help="L-inf radius, pixels in [0, 1]")
    p.add_argument("--steps", type=int, default=10, help="PGD's steps (fgsm-rs: one)")
    p.add_argument("train_args", nargs=argparse.REMAINDER,
                   help="-- then the arguments of `capsnet train`")
    args = p.parse_args(argv)
    train_args = [a for a in args.train_args if a != "--"]
    fit.train_one_epoch = adversarial_epochs(args.kind, args.eps, args.steps)
    return capsnet_main(["train", *train_args])


if __name__ == "__main__":
    raise SystemExit(main())
