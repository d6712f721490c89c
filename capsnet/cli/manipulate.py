"""`capsnet manipulate`: each dimension of a class capsule perturbed (the paper's Figure 4)."""
from __future__ import annotations

import argparse

import torch

from capsnet.cli.args import add_data_args, add_model_args, load_cli_model, load_cli_test_set
from capsnet.cli.predict import read_named
from capsnet.config import class_index, label_of
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

SEARCH_LIMIT = 2000  # test images searched for a correctly classified example of each class
DEFAULT_CLASSES = ("1", "3", "7")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "manipulate", help="picture of capsule dimensions perturbed (Figure 4)",
        description="For chosen classes, move each dimension of the winning capsule from "
        "-range to +range in steps and decode every perturbed pose.")
    add_model_args(p)
    add_data_args(p, model_default=True)
    p.add_argument("--digits", "--classes", dest="classes", nargs="+", default=None,
                   metavar="CLASS",
                   help="classes by index or name: the first correctly classified test image "
                        "of each is used (default: 1 3 7, or the first three classes of a "
                        "model with fewer than eight)")
    p.add_argument("--image", nargs="+", default=None, metavar="IMAGE",
                   help="use your own images instead of test images (prepared as by predict)")
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
    images = chosen_images(args, model)  # (K, [C,] H, W)
    scores, poses, _ = run_model(model, images)  # (K, J), (K, J, D)
    winners = scores.argmax(dim=1).tolist()
    deltas = perturbation_deltas(args.limit, args.step)  # (S,)
    grids = [to_uint8(perturbation_grid(model, poses[k, j], j, deltas))  # (D, S, H, W[, 3])
             for k, j in enumerate(winners)]
    labels = [label_of(model.config, j) for j in winners]
    titles = [j if label == str(j) else label for j, label in zip(winners, labels, strict=True)]
    path = manipulation_figure(grids, titles, deltas.tolist(), args.out)
    noun = "digits" if all(isinstance(t, int) for t in titles) else "classes"
    print(f"wrote {path}: {noun} {', '.join(labels) if noun == 'classes' else ' '.join(labels)}, "
          f"{poses.shape[-1]} dimensions x {len(deltas)} perturbations from "
          f"{-args.limit:+.2f} to {args.limit:+.2f}")
    return 0


def chosen_images(args: argparse.Namespace, model: torch.nn.Module) -> torch.Tensor:
    """uint8 images (K, [C,] H, W): your own, or per class its first correctly classified
    test image (else its first)."""
    if args.image:
        return torch.stack([torch.from_numpy(read_named(name, model.config))
                            for name in args.image])
    config = model.config
    given = args.classes or [c for c in DEFAULT_CLASSES if int(c) < config.num_classes] \
        or [str(j) for j in range(min(3, config.num_classes))]
    try:
        classes = [class_index(config, text) for text in given]
    except ValueError as exc:
        raise ValueError(f"--digits/--classes: {exc}") from None
    test = load_cli_test_set(args, config)
    images, labels = test.images[:SEARCH_LIMIT], test.labels[:SEARCH_LIMIT]  # (N, ...), (N,)
    return images[first_of_each_class(model, images, labels, classes)]
