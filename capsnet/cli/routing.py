"""`capsnet routing`: routing by agreement drawn for your own images or test images."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from capsnet.cli.args import add_data_args, add_model_args, load_cli_model, load_cli_test_set
from capsnet.cli.predict import expand_inputs, read_named, shown_name
from capsnet.config import class_names, label_of
from capsnet.data.image_dataset import display_images
from capsnet.routing_trace import RoutingTrace, routing_trace


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "routing", help="picture of the routing: couplings and support per iteration",
        description="For each image, a row of panels showing the routing into the class "
        "capsules, whichever model and router: CapsNet's primary capsules -> DigitCaps "
        "(dynamic, inverted-attention or self-attention routing), Efficient-CapsNet's "
        "primary capsules -> class capsules (self-attention, one pass), the EM model's "
        "ConvCaps2 -> class capsules (the assignments R of each EM iteration). Where the "
        "children sit on a grid: the input; where the winning class capsule's support comes "
        "from on that grid (coupling times vote length |c u_hat|, or R a for EM, summed over "
        "the capsule types, drawn over the input at the receptive-field centres); its "
        "couplings after each routing iteration (mean over the types); and the runner-up's. "
        "Where the grid is a single cell (Efficient-CapsNet at 28x28): the couplings per "
        "capsule type, a classes x types matrix per iteration, and the support per type. "
        "Own images are prepared for the model first, as by `capsnet predict`.")
    p.add_argument("images", nargs="*", metavar="IMAGE",
                   help="your own images (files, folders, or - for stdin)")
    p.add_argument("--index", type=int, nargs="+", default=None, metavar="N",
                   help="use these test-set images instead (0-based indices)")
    add_model_args(p)
    add_data_args(p, model_default=True)
    p.add_argument("--out", default="routing.png", help="PNG file to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    if bool(args.images) == bool(args.index):
        raise ValueError("give either IMAGE files or --index N [N ...] (one of the two)")
    model = load_cli_model(args)
    if args.index:
        images, titles, labels = test_images(args, model.config)
    else:
        images, titles, labels = own_images(args.images, model.config)
    trace = routing_trace(model, torch.from_numpy(images))
    scores = trace.scores.cpu().numpy()  # (K, J)
    predicted = scores.argmax(axis=1)  # (K,)
    titles = [f"{t}{label_of(model.config, int(p))} ({scores[k, p]:.2f})"
              for k, (t, p) in enumerate(zip(titles, predicted, strict=True))]
    wrong = [label is not None and label != int(p)
             for label, p in zip(labels, predicted, strict=True)]
    path = draw(trace, display_images(images), scores, titles, wrong,
                class_names(model.config), args.out)
    grid, children = trace.grid, trace.children
    count = f"{len(images)} image" + ("s" if len(images) != 1 else "")
    iterations = f"{trace.iterations} routing iteration" + ("s" if trace.iterations != 1 else "")
    print(f"wrote {path}: {count}, {iterations}, "
          f"{trace.types} capsule types on a {grid}x{grid} {children.name} grid"
          + (f", {sum(wrong)} mis-classified" if args.index else ""))
    per = "per capsule type, mean over positions" if grid == 1 else "mean over capsule types"
    print(f"{trace.routing} routing from the {children.name} capsules to the class capsules; "
          f"shown ({per}): {trace.coupling_meaning}")
    return 0


def draw(trace: RoutingTrace, images: np.ndarray, scores: np.ndarray, titles: list[str],
         wrong: list[bool], names: list[str], out: str) -> Path:
    """The trace's figure: maps on the children's grid, or per capsule type for a 1x1 grid."""
    from capsnet.figures import routing_figure, routing_types_figure

    shared = dict(wrong=wrong, class_names=names, symbol=trace.coupling_symbol,
                  support_label=trace.support_label, children=trace.children.name)
    if trace.grid == 1:
        return routing_types_figure(images, trace.type_maps().cpu().numpy(),
                                    trace.type_support().cpu().numpy(), scores, titles, out,
                                    **shared)
    return routing_figure(images, trace.coupling_maps().cpu().numpy(),
                          trace.support_maps().cpu().numpy(), scores, titles,
                          trace.children.centres, trace.children.field, out, **shared)


def test_images(args: argparse.Namespace, config) -> tuple[np.ndarray, list[str], list[int]]:
    """The --index test images (K, [C,] H, W) uint8, title stems and labels."""
    test = load_cli_test_set(args, config)
    bad = [i for i in args.index if not 0 <= i < len(test)]
    if bad:
        raise ValueError(f"--index {bad[0]} is out of range: the test set has {len(test)} "
                         f"images (0..{len(test) - 1})")
    images = test.images[args.index].numpy()
    labels = [int(test.labels[i]) for i in args.index]
    titles = [f"test #{i}: label {label_of(config, label)} \u2192 "
              for i, label in zip(args.index, labels, strict=True)]
    return images, titles, labels


def own_images(names: list[str], config) -> tuple[np.ndarray, list[str], list[None]]:
    """Your images prepared for the model (K, C, H, W) uint8 and title stems."""
    sources = expand_inputs(names)
    images = np.stack([read_named(name, config) for name in sources])  # (K, C, H, W)
    return images, [f"{Path(shown_name(name)).name}: " for name in sources], [None] * len(images)
