"""`capsnet reconstruct`, `manipulate`, `routing` and `plot`: pictures of a trained model
(the paper's Figures 3 and 4, the routing) and of a run's training curves."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from capsnet import inference
from capsnet.cli import args as cli_args
from capsnet.cli.predict import expand_inputs, read_named, shown_name
from capsnet.data.image_dataset import display_images
from capsnet.data.model_view import class_index, class_names, label_of
from capsnet.routing_trace import RoutingTrace, routing_trace
from capsnet.training.metrics_log import read_metrics

SEARCH_LIMIT = 2000  # test images searched for a correctly classified example of each class
DEFAULT_CLASSES = ("1", "3", "7")


def add_reconstruct(subparsers) -> None:
    p = subparsers.add_parser(
        "reconstruct", help="picture of test images over their reconstructions (Figure 3)",
        description="Draw the first test images and the first mis-classified ones, each above "
        "the decoder's reconstruction from its winning capsule (and, when mis-classified, "
        "from the true label's capsule), as in the paper's Figure 3.")
    cli_args.add_model_args(p)
    cli_args.add_data_args(p, model_default=True)
    p.add_argument("--count", type=int, default=10, help="first test images shown (default: 10)")
    p.add_argument("--misclassified", type=int, default=5,
                   help="mis-classified test images added after them (default: 5)")
    p.add_argument("--limit", type=int, default=None,
                   help="search at most the first N test images (default: all; the search "
                        "stops once enough mis-classified images are found)")
    p.add_argument("--columns", type=int, default=10, help="images per row (default: 10)")
    p.add_argument("--out", default="reconstructions.png", help="PNG file to write")
    p.set_defaults(func=run_reconstruct)


def run_reconstruct(args: argparse.Namespace, argv: list[str]) -> int:
    if args.count < 0 or args.misclassified < 0 or (args.limit is not None and args.limit < 1):
        raise ValueError("--count and --misclassified must be >= 0 and --limit >= 1")
    from capsnet.figures import reconstruction_figure

    model = cli_args.load_cli_model(args)
    inference.require_decoder(model)
    test = cli_args.load_cli_test_set(args, model.config)
    images, labels = test.images[:args.limit], test.labels[:args.limit]  # (N, [C,] H, W), (N,)
    predictions = inference.predict_until(model, images, labels, args.count,
                                          args.misclassified)  # (n,)
    images, labels = images[:len(predictions)], labels[:len(predictions)]
    chosen = inference.pick_examples(labels, predictions, args.count, args.misclassified)  # (K,)
    if len(chosen) == 0:
        raise ValueError("nothing to draw: --count and --misclassified are both 0")
    _, poses, recons = inference.run_model(model, images[chosen])  # (K, J, D), (K, C, H, W)
    with torch.no_grad():
        from_label = model.decoder(poses, labels[chosen].to(poses.device))  # (K, C, H, W)
    names = class_names(model.config)
    named = any(name != str(j) for j, name in enumerate(names))
    path = reconstruction_figure(display_images(images[chosen]), inference.to_uint8(recons),
                                 labels[chosen].tolist(), predictions[chosen].tolist(), args.out,
                                 args.columns, label_reconstructions=inference.to_uint8(from_label),
                                 class_names=names if named else None)
    wrong = int((predictions[chosen] != labels[chosen]).sum())
    accuracy = float((predictions == labels).float().mean())
    print(f"wrote {path}: {len(chosen)} test images, {wrong} of them mis-classified "
          f"(accuracy {accuracy:.4f} on the {len(labels)} test images searched)")
    return 0


def add_manipulate(subparsers) -> None:
    p = subparsers.add_parser(
        "manipulate", help="picture of capsule dimensions perturbed (Figure 4)",
        description="For chosen classes, move each dimension of the winning capsule from "
        "-range to +range in steps and decode every perturbed pose.")
    cli_args.add_model_args(p)
    cli_args.add_data_args(p, model_default=True)
    p.add_argument("--digits", "--classes", dest="classes", nargs="+", default=None,
                   metavar="CLASS",
                   help="classes by index or name: the first correctly classified test image "
                        "of each is used (default: 1 3 7, or the first three classes of a "
                        "model with fewer than eight)")
    p.add_argument("--image", nargs="+", default=None, metavar="IMAGE",
                   help="use your own images instead of test images (prepared as by predict)")
    p.add_argument("--range", type=float, default=inference.PERTURB_RANGE, dest="limit",
                   metavar="RANGE",
                   help=f"largest perturbation (default: {inference.PERTURB_RANGE})")
    p.add_argument("--step", type=float, default=inference.PERTURB_STEP,
                   help=f"perturbation step (default: {inference.PERTURB_STEP})")
    p.add_argument("--out", default="manipulation.png", help="PNG file to write")
    p.set_defaults(func=run_manipulate)


def run_manipulate(args: argparse.Namespace, argv: list[str]) -> int:
    if args.step <= 0 or args.limit < 0:
        raise ValueError("--step must be > 0 and --range >= 0")
    from capsnet.figures import manipulation_figure

    model = cli_args.load_cli_model(args)
    inference.require_decoder(model)
    images = chosen_images(args, model)  # (K, [C,] H, W)
    scores, poses, _ = inference.run_model(model, images)  # (K, J), (K, J, D)
    winners = scores.argmax(dim=1).tolist()
    deltas = inference.perturbation_deltas(args.limit, args.step)  # (S,)
    grids = [inference.to_uint8(inference.perturbation_grid(model, poses[k, j], j, deltas))
             for k, j in enumerate(winners)]  # each (D, S, H, W[, 3])
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
    test = cli_args.load_cli_test_set(args, config)
    images, labels = test.images[:SEARCH_LIMIT], test.labels[:SEARCH_LIMIT]  # (N, ...), (N,)
    return images[inference.first_of_each_class(model, images, labels, classes)]


def add_routing(subparsers) -> None:
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
    cli_args.add_model_args(p)
    cli_args.add_data_args(p, model_default=True)
    p.add_argument("--out", default="routing.png", help="PNG file to write")
    p.set_defaults(func=run_routing)


def run_routing(args: argparse.Namespace, argv: list[str]) -> int:
    if bool(args.images) == bool(args.index):
        raise ValueError("give either IMAGE files or --index N [N ...] (one of the two)")
    model = cli_args.load_cli_model(args)
    if args.index:
        images, titles, labels = test_images(args, model.config)
    else:
        sources = expand_inputs(args.images)
        images = np.stack([read_named(name, model.config) for name in sources])  # (K, C, H, W)
        titles = [f"{Path(shown_name(name)).name}: " for name in sources]
        labels = [None] * len(images)
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
    test = cli_args.load_cli_test_set(args, config)
    bad = [i for i in args.index if not 0 <= i < len(test)]
    if bad:
        raise ValueError(f"--index {bad[0]} is out of range: the test set has {len(test)} "
                         f"images (0..{len(test) - 1})")
    images = test.images[args.index].numpy()
    labels = [int(test.labels[i]) for i in args.index]
    titles = [f"test #{i}: label {label_of(config, label)} \u2192 "
              for i, label in zip(args.index, labels, strict=True)]
    return images, titles, labels


def add_plot(subparsers) -> None:
    p = subparsers.add_parser("plot", help="training curves of a run as a PNG",
                              description="Plot loss and error rate per epoch from the "
                              "metrics.csv of a run directory written by `capsnet train`.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory (holds metrics.csv)")
    p.add_argument("--out", default=None, help="PNG file to write (default: RUN_DIR/curves.png)")
    p.set_defaults(func=run_plot)


def run_plot(args: argparse.Namespace, argv: list[str]) -> int:
    from capsnet.figures import training_curves_figure

    run_dir = Path(args.run_dir)
    if not (run_dir / "metrics.csv").is_file():
        raise FileNotFoundError(f"{run_dir}: no metrics.csv here (expected a run directory "
                                "written by `capsnet train`)")
    rows = read_metrics(run_dir)
    if not rows:
        raise ValueError(f"{run_dir / 'metrics.csv'}: no epochs logged yet")
    out = Path(args.out) if args.out else run_dir / "curves.png"
    path = training_curves_figure(rows, out, title=run_title(run_dir, len(rows)))
    print(f"wrote {path}: {len(rows)} epochs")
    return 0


def run_title(run_dir: Path, epochs: int) -> str:
    """'<run dir>: N epochs', with the final test accuracy when results.json has it."""
    title = f"{run_dir}: {epochs} epochs"
    try:
        results = json.loads((run_dir / "results.json").read_text())
        accuracy = results["best"]["accuracy"]
    except (OSError, ValueError, KeyError, TypeError):
        return title
    return f"{title}; test accuracy {accuracy:.4f} (validation-selected epoch)"
