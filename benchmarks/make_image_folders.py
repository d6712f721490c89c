"""Write an IDX dataset (MNIST, Fashion-MNIST) out as image class folders, the layout
`capsnet train --dataset folder` reads: OUT/train/<class>/*.png and OUT/test/<class>/*.png.

    python benchmarks/make_image_folders.py --dataset fashion-mnist --out /tmp/fashion-png
    python benchmarks/make_image_folders.py --dataset fashion-mnist --out /tmp/fashion-colour \\
        --size 32 --colour --limit 12000                      # a colour set, 32x32 RGB

With ``--colour`` every image is resized to ``--size`` and painted: the object in one random
colour, the background in another (seeded per image), so that colour carries no label.
The class folders are named after the dataset's class names (made safe for file names).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capsnet.data.datasets import load_split  # noqa: E402
from capsnet.data.image_dataset import PIXEL_MAX  # noqa: E402

SPLITS = {"train": "train", "test": "test"}


def folder_name(class_name: str) -> str:
    """A class name as a folder name: 'T-shirt/top' -> 'T-shirt_top'."""
    return re.sub(r"[^\w.-]+", "_", class_name).strip("_") or "class"


def paint(grey: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A grey image (H, W) uint8 as RGB (H, W, 3): ink in one random colour, background in
    another, mixed by the grey level."""
    ink, paper = rng.integers(0, PIXEL_MAX + 1, size=(2, 3))
    alpha = grey.astype(np.float32)[..., None] / PIXEL_MAX  # (H, W, 1)
    return np.round(alpha * ink + (1 - alpha) * paper).astype(np.uint8)


def write_split(images: np.ndarray, labels: np.ndarray, classes: tuple[str, ...], out: Path,
                size: int | None, colour: bool, seed: int) -> int:
    """Write one split's images as PNG files; returns how many."""
    rng = np.random.default_rng(seed)
    folders = [out / folder_name(c) for c in classes]
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    for i, (grey, label) in enumerate(zip(images, labels, strict=True)):
        picture = Image.fromarray(grey)
        if size is not None:
            picture = picture.resize((size, size), Image.Resampling.BILINEAR)
        if colour:
            picture = Image.fromarray(paint(np.asarray(picture), rng))
        picture.save(folders[int(label)] / f"{i:05d}.png")
    return len(labels)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", required=True, help="folder to write train/ and test/ into")
    parser.add_argument("--size", type=int, default=None, help="resize to SIZE x SIZE")
    parser.add_argument("--colour", action="store_true", help="paint the images in colours")
    parser.add_argument("--limit", type=int, default=None,
                        help="the first N images of each split only")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for offset, (split, folder) in enumerate(SPLITS.items()):
        data = load_split(args.dataset, split, args.data_dir, download=True)
        images, labels = data.images.numpy(), data.labels.numpy()
        if args.limit is not None:
            images, labels = images[:args.limit], labels[:args.limit]
        count = write_split(images, labels, data.classes, Path(args.out) / folder, args.size,
                            args.colour, args.seed + offset)
        print(f"wrote {count} {split} images to {Path(args.out) / folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
