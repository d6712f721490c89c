"""`capsnet manipulate`: each dimension of a digit's capsule perturbed (the paper's Figure 4)."""
from __future__ import annotations

import argparse

import torch

from capsnet.cli.args import add_data_args, add_model_args, load_cli_model
from capsnet.data.datasets import load_split
from capsnet.inference import (
    PERTURB_RANGE,
    PERTURB_STEP,
    first_of_each_class,
    perturbation_deltas,
    perturbation_grid,
    require_decoder,
    run_model,
    to_uint8,
)
from capsnet.preprocess import PreprocessError, prepare_image

SEARCH_LIMIT = 2000  # test images searched for a correctly classified example of each digit


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "manipulate", help="picture of capsule dimensions perturbed (Figure 4)",
        description="For chosen digits, move each dimension of the winning capsule from "
        "-range to +range in steps and decode every perturbed pose.")
    add_model_args(p)
    add_data_args(p)
    p.add_argument("--digits", type=int, nargs="+", default=[1, 3, 7],
                   help="use the first correctly classified test image of each (default: 1 3 7)")
    p.add_argument("--image", nargs="+", default=None, metavar="IMAGE",
                   help="use your own digit images instead of test images")
    p.add_argument("--range", type=float, default=PERTURB_RANGE, dest="limit", metavar="RANGE",
                   help=f"largest perturbation (default: {PERTURB_RANGE})")
    p.add_argument("--step", type=float, default=PERTURB_STEP,
                   help=f"perturbation step (default: {PERTURB_STEP})")
    p.add_argument("--out", default="manipulation.png", help="PNG file to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    if args.step <= 0 or args.limit < 0:
        raise ValueError("--step must be > 0 and --range >= 0")
    from capsnet.figures import manipulation_figure

    model = load_cli_model(args)
    require_decoder(model)
    images = chosen_images(args, model)  # (K, 28, 28)
    scores, poses, _ = run_model(model, images)  # (K, J), (K, J, D)
    digits = scores.argmax(dim=1).tolist()
    deltas = perturbation_deltas(args.limit, args.step)  # (S,)
    grids = [to_uint8(perturbation_grid(model, poses[k, digit], digit, deltas))  # (D, S, 28, 28)
             for k, digit in enumerate(digits)]
    path = manipulation_figure(grids, digits, deltas.tolist(), args.out)
    print(f"wrote {path}: digits {' '.join(map(str, digits))}, {poses.shape[-1]} dimensions x "
          f"{len(deltas)} perturbations from {-args.limit:+.2f} to {args.limit:+.2f}")
    return 0


def chosen_images(args: argparse.Namespace, model: torch.nn.Module) -> torch.Tensor:
    """uint8 images (K, 28, 28): the user's own images, or for each of --digits the first
    test image of that class the model classifies correctly (else the first of that class)."""
    if args.image:
        return torch.stack([torch.from_numpy(_prepare(name)) for name in args.image])
    num_classes = model.config.num_classes
    bad = [d for d in args.digits if not 0 <= d < num_classes]
    if bad:
        raise ValueError(f"--digits must be in 0..{num_classes - 1}, got {bad}")
    test = load_split(args.dataset, "test", args.data_dir, args.download)
    images, labels = test.images[:SEARCH_LIMIT], test.labels[:SEARCH_LIMIT]  # (N, 28, 28), (N,)
    return images[first_of_each_class(model, images, labels, args.digits)]


def _prepare(name: str):
    try:
        return prepare_image(name)  # (28, 28) uint8
    except PreprocessError as exc:
        raise PreprocessError(f"{name}: {exc}") from None
