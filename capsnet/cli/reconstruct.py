"""`capsnet reconstruct`: test images over their reconstructions (the paper's Figure 3)."""
from __future__ import annotations

import argparse

import torch

from capsnet.cli.args import add_data_args, add_model_args, load_cli_model, load_cli_test_set
from capsnet.config import class_names
from capsnet.data.image_dataset import display_images
from capsnet.inference import pick_examples, predict_until, require_decoder, run_model, to_uint8


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "reconstruct", help="picture of test images over their reconstructions (Figure 3)",
        description="Draw the first test images and the first mis-classified ones, each above "
        "the decoder's reconstruction from its winning capsule (and, when mis-classified, "
        "from the true label's capsule), as in the paper's Figure 3.")
    add_model_args(p)
    add_data_args(p, model_default=True)
    p.add_argument("--count", type=int, default=10, help="first test images shown (default: 10)")
    p.add_argument("--misclassified", type=int, default=5,
                   help="mis-classified test images added after them (default: 5)")
    p.add_argument("--limit", type=int, default=None,
                   help="search at most the first N test images (default: all; the search "
                        "stops once enough mis-classified images are found)")
    p.add_argument("--columns", type=int, default=10, help="images per row (default: 10)")
    p.add_argument("--out", default="reconstructions.png", help="PNG file to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    if args.count < 0 or args.misclassified < 0 or (args.limit is not None and args.limit < 1):
        raise ValueError("--count and --misclassified must be >= 0 and --limit >= 1")
    from capsnet.figures import reconstruction_figure

    model = load_cli_model(args)
    require_decoder(model)
    test = load_cli_test_set(args, model.config)
    images, labels = test.images[:args.limit], test.labels[:args.limit]  # (N, [C,] H, W), (N,)
    predictions = predict_until(model, images, labels, args.count, args.misclassified)  # (n,)
    images, labels = images[:len(predictions)], labels[:len(predictions)]
    chosen = pick_examples(labels, predictions, args.count, args.misclassified)  # (K,)
    if len(chosen) == 0:
        raise ValueError("nothing to draw: --count and --misclassified are both 0")
    _, poses, recons = run_model(model, images[chosen])  # (K, J, D), (K, C, H, W)
    with torch.no_grad():
        from_label = model.decoder(poses, labels[chosen].to(poses.device))  # (K, C, H, W)
    names = class_names(model.config)
    named = any(name != str(j) for j, name in enumerate(names))
    path = reconstruction_figure(display_images(images[chosen]), to_uint8(recons),
                                 labels[chosen].tolist(), predictions[chosen].tolist(), args.out,
                                 args.columns, label_reconstructions=to_uint8(from_label),
                                 class_names=names if named else None)
    wrong = int((predictions[chosen] != labels[chosen]).sum())
    accuracy = float((predictions == labels).float().mean())
    print(f"wrote {path}: {len(chosen)} test images, {wrong} of them mis-classified "
          f"(accuracy {accuracy:.4f} on the {len(labels)} test images searched)")
    return 0

