"""`capsnet predict`: the class of each of your own images (files, folders or stdin)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from capsnet.cli import args as cli_args
from capsnet.data.image_dataset import PIXEL_MAX
from capsnet.data.model_view import indexed_name
from capsnet.inference import Prediction, predict_prepared
from capsnet.preprocess import PreprocessError, prepare_for_model

STDIN = "-"
STDIN_NAME = "stdin"  # how an image read from stdin is named in the output
ASCII_RAMP = " .:-=+*#%@"  # dark to bright
PIXEL_LEVELS = PIXEL_MAX + 1


def add_predict(subparsers) -> None:
    p = subparsers.add_parser(
        "predict", help="predict the class of your own images",
        description="Predict the class of your own images (the digit, for an MNIST model). "
        "Each image is prepared for the model: for a digit model made MNIST-like (grayscale, "
        "inverted if dark-on-light, cropped to the ink, scaled to fit 20x20 and centred by "
        "centre of mass in 28x28); for any other model (Fashion-MNIST, CIFAR-10, SVHN, your "
        "own folders) converted to the model's channels and resized to its size, as the "
        "training images were.")
    p.add_argument("images", nargs="+", metavar="IMAGE",
                   help="image files (PNG, JPEG, any format Pillow reads), folders of them, "
                        "or - for one image on stdin")
    cli_args.add_model_args(p)
    p.add_argument("--top-k", type=int, default=3,
                   help="classes listed per image, the prediction included (default: 3)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON list of results: source, class (its name), index "
                        "(and digit, the same index), length, alternatives, lengths")
    p.add_argument("--show", action="store_true",
                   help="draw the input as the model saw it beside its reconstruction, as text")
    p.add_argument("--save-dir", default=None, metavar="DIR",
                   help="write one PNG per image: input, reconstruction and capsule lengths")
    p.set_defaults(func=run_predict)


def expand_inputs(names: list[str]) -> list[str]:
    """Names -> sources: '-' stays, a folder becomes its image files (sorted), else a path."""
    suffixes = {s.lower() for s in Image.registered_extensions()}
    sources = []
    for name in names:
        path = Path(name)
        if name != STDIN and path.is_dir():
            found = sorted(str(f) for f in path.iterdir()
                           if f.is_file() and f.suffix.lower() in suffixes)
            sources += found or [name]  # an empty folder is reported as "not a file"
        else:
            sources.append(name)
    return sources


def read_source(name: str, config) -> np.ndarray:
    """One source -> uint8 (C, H, W) for the model with ``config``; PreprocessError."""
    if name == STDIN:
        return prepare_for_model(sys.stdin.buffer.read(), config)
    if Path(name).is_dir():
        raise PreprocessError("a folder with no image files")
    return prepare_for_model(name, config)


def read_named(name: str, config) -> np.ndarray:
    """:func:`read_source`, its PreprocessError prefixed with the source's name."""
    try:
        return read_source(name, config)  # (C, H, W)
    except PreprocessError as exc:
        raise PreprocessError(f"{shown_name(name)}: {exc}") from None


def shown_name(name: str) -> str:
    return STDIN_NAME if name == STDIN else name


def run_predict(args: argparse.Namespace, argv: list[str]) -> int:
    if args.top_k < 1:
        raise ValueError("--top-k must be at least 1")
    model = cli_args.load_cli_model(args)
    prepared, names, errors = [], [], []
    for name in expand_inputs(args.images):
        shown = shown_name(name)
        try:
            prepared.append(read_source(name, model.config))  # (C, H, W)
            names.append(shown)
        except PreprocessError as exc:
            errors.append({"source": shown, "error": str(exc)})
            print(f"capsnet: error: {shown}: {exc}", file=sys.stderr)
    images = np.stack(prepared) if prepared else np.zeros((0, 1, 1, 1), dtype=np.uint8)
    predictions = predict_prepared(model, images, names, args.top_k)
    if args.save_dir:
        save_pictures(predictions, Path(args.save_dir))
    if args.json:
        print(json.dumps([p.as_dict() for p in predictions] + errors, indent=2))
    else:
        for p in predictions:
            print(format_prediction(p))
            if args.show:
                print(ascii_pair(p.image, p.reconstruction))
    return 1 if errors else 0


def format_prediction(p: Prediction) -> str:
    """'my_seven.jpg: 7  length 0.912   then 1 (0.143), 9 (0.088)', with class names
    'shoe.png: Sneaker (7)  length 0.910   then Sandal (5) 0.051'."""
    line = f"{p.source}: {_label(p, p.digit)}  length {p.length:.3f}"
    if any(p.name_of(j) != str(j) for j in range(len(p.lengths))):  # named classes
        others = ", ".join(f"{_label(p, d)} {s:.3f}" for d, s in p.alternatives)
    else:
        others = ", ".join(f"{d} ({s:.3f})" for d, s in p.alternatives)
    return f"{line}   then {others}" if others else line


def _label(p: Prediction, index: int) -> str:
    return indexed_name([p.name_of(j) for j in range(len(p.lengths))], index)


def ascii_pair(image: np.ndarray, reconstruction: np.ndarray | None) -> str:
    """Two uint8 images (H, W[, 3]) side by side as text, two characters per pixel."""
    shown = [image] if reconstruction is None else [image, reconstruction]
    panels = [a if a.ndim == 2 else a.mean(axis=-1) for a in shown]  # (H, W) brightness
    width = 2 * image.shape[1]
    header = "  ".join(t.center(width) for t in ["input", "reconstruction"][:len(panels)])
    rows = ["  ".join("".join(2 * ASCII_RAMP[int(v) * len(ASCII_RAMP) // PIXEL_LEVELS]
                              for v in panel[r]) for panel in panels)
            for r in range(image.shape[0])]
    return "\n".join([header, *rows])


def save_pictures(predictions: list[Prediction], out_dir: Path) -> None:
    from capsnet.figures import prediction_figure

    used: set[str] = set()
    for p in predictions:
        stem = Path(p.source).stem
        name, n = stem, 1
        while name in used:
            n += 1
            name = f"{stem}-{n}"
        used.add(name)
        prediction_figure(p.image, p.reconstruction, p.lengths,
                          f"{p.source}: predicted {_label(p, p.digit)} (length {p.length:.3f})",
                          out_dir / f"{name}.png", p.class_names)
