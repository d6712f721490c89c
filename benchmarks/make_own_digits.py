"""Make digit images that are not from MNIST's files, to measure `capsnet predict` on them.

Two kinds, five images per digit by default (50 in all: 3 typed, 2 drawn), each named
'<digit>_<kind>-<n>.<ext>':

- ``font``: the digit typed in a TrueType font installed on the machine (DejaVu, Liberation),
  at a random size, stroke width and slight rotation, anywhere on a larger canvas;
- ``pen``: the digit drawn as a jittered pen stroke from a hand-made template (a crude model
  of handwriting), slanted and rotated, with a random pen width.

Each is then given a random look: dark ink on light paper (often with uneven lighting and
noise, like a photo) or light on dark, saved as PNG or JPEG. The same seed gives the same
files.

    python benchmarks/make_own_digits.py --out /tmp/own-digits
    python -m capsnet predict /tmp/own-digits --checkpoint runs/latest/best.pt --json > own.json
    python benchmarks/make_own_digits.py --score own.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

FONT_DIRS = [Path("/usr/share/fonts/truetype/dejavu"), Path("/usr/share/fonts/truetype/liberation")]
FONT_NAMES = ["DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSans-Oblique.ttf", "DejaVuSerif.ttf",
              "DejaVuSerif-Italic.ttf", "DejaVuSansMono.ttf", "DejaVuSansCondensed-Bold.ttf",
              "LiberationSans-Regular.ttf", "LiberationSerif-Italic.ttf",
              "LiberationMono-Regular.ttf", "LiberationSansNarrow-Bold.ttf"]
CANVAS = 320  # side of the drawing canvas in pixels
MAX_ROTATION = 12  # degrees either way
FONT_SHARE = 0.6  # typed digits; the rest are pen drawings

# Pen templates: strokes of (x, y) points in a unit box, y downwards.
def _arc(cx, cy, rx, ry, start, stop, n=14):
    return [(cx + rx * math.cos(math.radians(a)), cy + ry * math.sin(math.radians(a)))
            for a in np.linspace(start, stop, n)]


PEN = {
    0: [_arc(0.5, 0.5, 0.28, 0.4, -90, 275)],
    1: [[(0.38, 0.25), (0.55, 0.1), (0.55, 0.9)]],
    2: [_arc(0.5, 0.32, 0.25, 0.22, 200, 380) + [(0.25, 0.9), (0.8, 0.9)]],
    3: [_arc(0.48, 0.3, 0.24, 0.2, 200, 450) + _arc(0.48, 0.7, 0.26, 0.2, -90, 160)],
    4: [[(0.62, 0.9), (0.62, 0.1), (0.2, 0.65), (0.82, 0.65)]],
    5: [[(0.75, 0.1), (0.32, 0.1), (0.28, 0.45)] + _arc(0.5, 0.66, 0.26, 0.23, -120, 150)],
    6: [[(0.68, 0.1), (0.42, 0.3)] + _arc(0.5, 0.68, 0.22, 0.22, 200, 560)],
    7: [[(0.2, 0.12), (0.8, 0.12), (0.42, 0.9)]],
    8: [_arc(0.5, 0.29, 0.2, 0.19, 90, 450), _arc(0.5, 0.7, 0.25, 0.21, -90, 270)],
    9: [_arc(0.5, 0.32, 0.22, 0.22, 0, 360), [(0.72, 0.32), (0.66, 0.9)]],
}


def fonts() -> list[Path]:
    found = [d / n for n in FONT_NAMES for d in FONT_DIRS if (d / n).is_file()]
    if not found:
        sys.exit("no DejaVu or Liberation fonts found (apt-get install fonts-dejavu "
                 "fonts-liberation)")
    return found


def font_digit(digit: int, font: Path, rng: np.random.Generator) -> Image.Image:
    """White-on-black 'ink' mask of a typed digit."""
    size = int(rng.integers(90, 220))
    image = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(image)
    typeface = ImageFont.truetype(str(font), size)
    left, top, right, bottom = draw.textbbox((0, 0), str(digit), font=typeface)
    x = rng.integers(0, max(1, CANVAS - (right - left))) - left
    y = rng.integers(0, max(1, CANVAS - (bottom - top))) - top
    draw.text((int(x), int(y)), str(digit), fill=255, font=typeface,
              stroke_width=int(rng.integers(0, max(1, size // 25) + 1)), stroke_fill=255)
    return image.rotate(float(rng.uniform(-MAX_ROTATION, MAX_ROTATION)),
                        resample=Image.Resampling.BILINEAR)


def pen_digit(digit: int, rng: np.random.Generator) -> Image.Image:
    """White-on-black 'ink' mask of a jittered, slanted pen drawing of a digit."""
    image = Image.new("L", (CANVAS, CANVAS), 0)
    draw = ImageDraw.Draw(image)
    scale = rng.uniform(0.45, 0.85) * CANVAS
    slant = rng.uniform(-0.3, 0.2)
    origin = rng.uniform(0.05, 1 - 0.05 - scale / CANVAS, size=2) * CANVAS
    width = int(rng.integers(6, 22))
    for stroke in PEN[digit]:
        points = np.asarray(stroke) + rng.normal(0, 0.02, (len(stroke), 2))  # (n, 2) jitter
        points[:, 0] += slant * (0.5 - points[:, 1])  # italic slant
        xy = [(float(origin[0] + px * scale), float(origin[1] + py * scale)) for px, py in points]
        draw.line(xy, fill=255, width=width, joint="curve")
        for px, py in (xy[0], xy[-1]):  # round pen ends
            draw.ellipse([px - width / 2, py - width / 2, px + width / 2, py + width / 2], fill=255)
    return image.rotate(float(rng.uniform(-MAX_ROTATION, MAX_ROTATION)),
                        resample=Image.Resampling.BILINEAR)


def photograph(mask: Image.Image, rng: np.random.Generator) -> Image.Image:
    """Put an ink mask (white on black) on paper: dark-on-light with uneven light and noise
    (two images in three), else light-on-dark."""
    ink = np.asarray(mask, dtype=np.float64) / 255.0  # (H, W) in [0, 1]
    if rng.random() < 2 / 3:
        ramp = np.linspace(0, 1, CANVAS)
        light = rng.uniform(170, 235) + rng.uniform(-30, 30) * ramp[None, :] \
            + rng.uniform(-20, 20) * ramp[:, None]  # (H, W) uneven lighting
        paper = light + rng.normal(0, rng.uniform(0, 6), ink.shape)
        pixels = paper * (1 - ink) + rng.uniform(10, 70) * ink
    else:
        pixels = rng.uniform(0, 40) * (1 - ink) + rng.uniform(180, 255) * ink
    grey = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    return grey.convert("RGB") if rng.random() < 0.5 else grey


def make(out: Path, per_digit: int, seed: int) -> int:
    rng = np.random.default_rng(seed)
    typefaces = fonts()
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    for digit in range(10):
        for n in range(per_digit):
            if n < round(per_digit * FONT_SHARE):
                kind, mask = "font", font_digit(digit, typefaces[rng.integers(len(typefaces))], rng)
            else:
                kind, mask = "pen", pen_digit(digit, rng)
            image = photograph(mask, rng)
            ext = "jpg" if rng.random() < 0.4 else "png"
            options = {"quality": int(rng.integers(60, 95))} if ext == "jpg" else {}
            image.save(out / f"{digit}_{kind}-{n}.{ext}", **options)
            count += 1
    print(f"wrote {count} images to {out} ({len(typefaces)} fonts found)")
    return count


def score(results_json: Path) -> float:
    """Accuracy of `capsnet predict --json` output, the true digit being each file name's
    first character; prints per-kind accuracy and the mistakes."""
    results = json.loads(results_json.read_text())
    right: dict[str, list[bool]] = {}
    for r in results:
        name = Path(r["source"]).name
        if "error" in r:
            print(f"  {name}: error: {r['error']}")
            right.setdefault("all", []).append(False)
            continue
        truth, kind = int(name[0]), name.split("_")[1].split("-")[0]
        ok = r["digit"] == truth
        right.setdefault(kind, []).append(ok)
        right.setdefault("all", []).append(ok)
        if not ok:
            print(f"  {name}: predicted {r['digit']} (length {r['length']:.3f})")
    for kind, oks in sorted(right.items()):
        print(f"{kind}: {sum(oks)}/{len(oks)} = {sum(oks) / len(oks):.3f}")
    return sum(right["all"]) / len(right["all"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("own-digits"))
    parser.add_argument("--per-digit", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--score", type=Path, default=None, metavar="PREDICT_JSON",
                        help="instead of making images, score `capsnet predict --json` output")
    args = parser.parse_args()
    if args.score:
        score(args.score)
    else:
        make(args.out, args.per_digit, args.seed)


if __name__ == "__main__":
    main()
