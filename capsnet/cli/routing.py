"""`capsnet routing`: routing by agreement drawn for your own images or MNIST test images."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from capsnet.cli.args import add_data_args, add_model_args, load_cli_model
from capsnet.cli.predict import STDIN, STDIN_NAME, expand_inputs, read_source
from capsnet.data.datasets import load_split
from capsnet.preprocess import PreprocessError
from capsnet.routing_trace import receptive_fields, routing_trace


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "routing", help="picture of the routing: couplings and support per iteration",
        description="For each image, a row of panels: the input; where the winning digit "
        "capsule's support comes from on the primary-capsule grid (|c u_hat| summed over "
        "the capsule types, drawn over the input at the receptive-field centres); its "
        "coupling coefficients after each routing iteration; and the runner-up's. Own images "
        "are made MNIST-like first, as by `capsnet predict`.")
    p.add_argument("images", nargs="*", metavar="IMAGE",
                   help="your own digit images (files, folders, or - for stdin)")
    p.add_argument("--index", type=int, nargs="+", default=None, metavar="N",
                   help="use these test-set images instead (0-based indices)")
    add_model_args(p)
    add_data_args(p)
    p.add_argument("--out", default="routing.png", help="PNG file to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    if bool(args.images) == bool(args.index):
        raise ValueError("give either IMAGE files or --index N [N ...] (one of the two)")
    from capsnet.figures import routing_figure

    model = load_cli_model(args)
    if args.index:
        images, titles, labels = test_images(args)
    else:
        images, titles, labels = own_images(args.images)
    trace = routing_trace(model, torch.from_numpy(images))
    lengths = trace.lengths.cpu().numpy()  # (K, J)
    predicted = lengths.argmax(axis=1)  # (K,)
    titles = [f"{t}{p} ({lengths[k, p]:.2f})" for k, (t, p) in enumerate(
        zip(titles, predicted, strict=True))]
    wrong = [label is not None and label != int(p)
             for label, p in zip(labels, predicted, strict=True)]
    centres, field = receptive_fields(model.config)
    path = routing_figure(images, trace.coupling_maps().cpu().numpy(),
                          trace.support_maps().cpu().numpy(), lengths, titles, centres, field,
                          args.out, wrong)
    grid = trace.grid
    count = f"{len(images)} image" + ("s" if len(images) != 1 else "")
    print(f"wrote {path}: {count}, {trace.iterations} routing iterations, "
          f"{trace.types} capsule types on a {grid}x{grid} primary grid"
          + (f", {sum(wrong)} mis-classified" if args.index else ""))
    return 0


def test_images(args: argparse.Namespace) -> tuple[np.ndarray, list[str], list[int]]:
    """The --index test images (K, H, W) or (K, C, H, W) uint8, title stems and labels."""
    test = load_split(args.dataset, "test", args.data_dir, args.download)
    bad = [i for i in args.index if not 0 <= i < len(test)]
    if bad:
        raise ValueError(f"--index {bad[0]} is out of range: the test set has {len(test)} "
                         f"images (0..{len(test) - 1})")
    images = test.images[args.index].numpy()
    labels = [int(test.labels[i]) for i in args.index]
    titles = [f"test #{i}: label {label} \u2192 "
              for i, label in zip(args.index, labels, strict=True)]
    return images, titles, labels


def own_images(names: list[str]) -> tuple[np.ndarray, list[str], list[None]]:
    """The user's images made MNIST-like (K, 28, 28) uint8 and title stems; a file that
    holds no usable digit stops the command with a one-line error naming it."""
    images, titles = [], []
    for name in expand_inputs(names):
        shown = STDIN_NAME if name == STDIN else name
        try:
            images.append(read_source(name))  # (28, 28)
        except PreprocessError as exc:
            raise PreprocessError(f"{shown}: {exc}") from None
        titles.append(f"{Path(shown).name}: ")
    return np.stack(images), titles, [None] * len(images)
