"""Write the own-data study sets as image class folders (OUT/<set>/train|test/<class>/*.png),
the layout `capsnet train --dataset folder` reads. Made from MNIST and Fashion-MNIST, so
nothing but those two IDX sets is needed; never committed, rebuilt in seconds:

    python benchmarks/make_study_sets.py --out /tmp/study              # every set
    python benchmarks/make_study_sets.py --out /tmp/study --sets textured

Sets (each seeded; colours and textures carry no label):
  fashion-colour   Fashion-MNIST items at 32x32, object and ground in random colours, 10 classes
  mixed-20         20 classes (digits 0-9 and the 10 Fashion-MNIST items), random colours,
                   images of mixed sizes (28-44 px): train it with --image-size 32
  large-48         Fashion-MNIST items at 48x48 in random colours
  textured         digits in one random colour on a random coloured texture (gratings, blobs and
                   pixel noise) at 32x32: a ground that is not one colour, as in photos
Fashion-MNIST grey and MNIST themselves are read as IDX files (--dataset fashion-mnist|mnist).
"""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from capsnet.data.datasets import load_split  # noqa: E402
from capsnet.data.image_dataset import PIXEL_MAX  # noqa: E402


@dataclass(frozen=True)
class StudySet:
    """How one set is made: its sources, sizes and how each grey image is painted."""

    sources: tuple[str, ...]  # IDX datasets whose classes are concatenated in this order
    train: int  # training images (the first of each source's training split, mixed)
    test: int
    size: Callable[[np.random.Generator], int]  # side of each written image
    paint: str  # 'flat' (two colours) or 'texture' (coloured ink over a texture)


STUDY_SETS = {
    "fashion-colour": StudySet(("fashion-mnist",), 3000, 1000, lambda rng: 32, "flat"),
    "mixed-20": StudySet(("mnist", "fashion-mnist"), 3300, 1000,
                         lambda rng: int(rng.integers(28, 45)), "flat"),
    "large-48": StudySet(("fashion-mnist",), 3000, 1000, lambda rng: 48, "flat"),
    "textured": StudySet(("mnist",), 3000, 1000, lambda rng: 32, "texture"),
}


def folder_name(class_name: str) -> str:
    """A class name as a folder name: 'T-shirt/top' -> 'T-shirt_top'."""
    return re.sub(r"[^\w.-]+", "_", class_name).strip("_") or "class"


def flat_paint(alpha: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Ink alpha (H, W) in [0, 1] -> RGB (H, W, 3) float: ink and ground one colour each."""
    ink, ground = rng.uniform(0, PIXEL_MAX, size=(2, 3))
    return alpha[..., None] * ink + (1 - alpha[..., None]) * ground


def texture(side: int, rng: np.random.Generator) -> np.ndarray:
    """A random coloured texture (side, side, 3) in [0, 255]: two oriented gratings, a few
    soft blobs and pixel noise, each in a colour of its own."""
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / side  # (side, side)
    ground = np.zeros((side, side, 3), np.float32)
    for _ in range(2):  # gratings
        angle, freq, phase = rng.uniform(0, np.pi), rng.uniform(2, 8), rng.uniform(0, 2 * np.pi)
        wave = 0.5 + 0.5 * np.sin(2 * np.pi * freq * (xx * np.cos(angle) + yy * np.sin(angle))
                                  + phase)
        ground += wave[..., None] * rng.uniform(0, 1, 3)
    for _ in range(3):  # blobs
        cy, cx, radius = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.1, 0.4)
        blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * radius**2))
        ground += blob[..., None] * rng.uniform(-1, 1, 3)
    ground += rng.normal(0, 0.15, ground.shape)  # pixel noise
    ground -= ground.min()
    return PIXEL_MAX * ground / max(float(ground.max()), 1e-6)


def texture_paint(alpha: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    ink = rng.uniform(0, PIXEL_MAX, size=3)
    return alpha[..., None] * ink + (1 - alpha[..., None]) * texture(alpha.shape[0], rng)


PAINTERS = {"flat": flat_paint, "texture": texture_paint}


def pooled_split(spec: StudySet, split: str, count: int, data_dir: str | None,
                 rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray, list[str]]:
    """``count`` grey images (28, 28) uint8 drawn evenly from the sources, their labels
    offset so that each source's classes follow the previous one's, and the class names."""
    images, labels, classes = [], [], []
    per_source = -(-count // len(spec.sources))
    for name in spec.sources:
        # Fashion-MNIST: the usual lookup (Debian's package, the cache, a download)
        data = load_split(name, split, data_dir if name == "mnist" else None, download=True)
        pick = rng.permutation(len(data.labels))[:per_source]
        images += list(data.images.numpy()[pick])
        labels.append(data.labels.numpy()[pick] + len(classes))
        prefix = "digit-" if name == "mnist" and len(spec.sources) > 1 else ""
        classes += [prefix + c for c in data.classes]
    labels = np.concatenate(labels)
    keep = rng.permutation(len(labels))[:count]
    return [images[i] for i in keep], labels[keep], classes


def write_set(name: str, out: Path, data_dir: str | None, seed: int) -> None:
    spec = STUDY_SETS[name]
    for offset, (split, count) in enumerate((("train", spec.train), ("test", spec.test))):
        rng = np.random.default_rng([seed, offset, sorted(STUDY_SETS).index(name)])
        images, labels, classes = pooled_split(spec, split, count, data_dir, rng)
        folders = [out / name / split / folder_name(c) for c in classes]
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
        for i, (grey, label) in enumerate(zip(images, labels, strict=True)):
            side = spec.size(rng)
            alpha = np.asarray(Image.fromarray(grey).resize((side, side),
                                                            Image.Resampling.BILINEAR))
            rgb = PAINTERS[spec.paint](alpha.astype(np.float32) / PIXEL_MAX, rng)
            picture = Image.fromarray(np.clip(np.round(rgb), 0, PIXEL_MAX).astype(np.uint8))
            picture.save(folders[int(label)] / f"{i:05d}.png")
        print(f"{name}: wrote {len(labels)} {split} images of {len(classes)} classes "
              f"to {out / name / split}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write the sets into")
    parser.add_argument("--sets", nargs="+", choices=sorted(STUDY_SETS),
                        default=sorted(STUDY_SETS))
    parser.add_argument("--data-dir", default=None,
                        help="folder holding the MNIST IDX files (default: the usual lookup)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in args.sets:
        write_set(name, Path(args.out), args.data_dir, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
