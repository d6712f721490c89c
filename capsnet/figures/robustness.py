"""Figures of the robustness experiments: accuracy against rotation, example test digits of
each transformed set, and MultiMNIST pairs with their two reconstructions."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from matplotlib.figure import Figure

from capsnet.data.image_dataset import PIXEL_MAX, display_images
from capsnet.experiments.robustness import AFFINE, ROTATION
from capsnet.figures.common import (
    PERCENT,
    RIGHT_COLOR,
    WRONG_COLOR,
    accuracy_chart,
    save_figure,
    show_image,
)

EXAMPLE_INCHES = (1.0, 1.1)  # per image: width, height of a row
PAIR_INCHES = (1.3, 1.45)  # per pair: width, height of a row


def rotation_figure(rows: Sequence[dict], path: str | os.PathLike, title: str = "") -> Path:
    """Accuracy against rotation angle, a line per model, its affine accuracy dotted."""
    fig, ax = accuracy_chart("rotation angle (degrees, counter-clockwise)", "test accuracy (%)",
                             title)
    labels = list(dict.fromkeys(r["model"] for r in rows))
    for index, label in enumerate(labels):
        color = f"C{index}"
        mine = sorted((r for r in rows if r["model"] == label and r["transform"] == ROTATION),
                      key=lambda r: r["angle_deg"])
        ax.plot([r["angle_deg"] for r in mine], [PERCENT * r["accuracy"] for r in mine],
                marker="o", color=color, label=f"{label}: rotated")
        for r in rows:
            if r["model"] == label and r["transform"] == AFFINE:
                ax.axhline(PERCENT * r["accuracy"], color=color, linestyle=":",
                           label=f"{label}: affine set ({PERCENT * r['accuracy']:.1f}%)")
    ax.legend(fontsize="small", loc="lower center")
    return save_figure(fig, path)


def examples_figure(sets: dict[str, torch.Tensor], path: str | os.PathLike,
                    count: int = 10) -> Path:
    """A row of ``count`` images (N, [C,] H, W) uint8 for each named set."""
    width, height = EXAMPLE_INCHES
    fig = Figure(figsize=(width * count, height * len(sets)))
    axes = fig.subplots(len(sets), count, squeeze=False)
    for row, (name, images) in enumerate(sets.items()):
        shown = display_images(images[:count])  # (count, H, W) or (count, H, W, 3)
        for col in range(count):
            show_image(axes[row][col], shown[col])
        axes[row][0].set_ylabel(name, rotation=0, ha="right", va="center", fontsize="small")
    return save_figure(fig, path)


def pairs_figure(images: torch.Tensor, first: torch.Tensor, second: torch.Tensor,
                 labels: torch.Tensor, predicted: torch.Tensor, path: str | os.PathLike) -> Path:
    """MultiMNIST pairs and their two reconstructions (the paper's Figure 5).

    images (K, H, W) uint8; first, second (K, H, W) float in [0, 1]; labels, predicted
    (K, 2). Rows: input, first (red), second (green), both overlaid."""
    count = images.shape[0]
    first, second = first.float().cpu().clamp(0, 1), second.float().cpu().clamp(0, 1)
    dark = torch.zeros_like(first)  # (K, H, W)
    rows = [("input", images.float().cpu() / PIXEL_MAX, "gray"),
            ("capsule 1", torch.stack([first, dark, dark], -1), None),  # (K, H, W, 3) red
            ("capsule 2", torch.stack([dark, second, dark], -1), None),  # green
            ("both", torch.stack([first, second, dark], -1), None)]
    width, height = PAIR_INCHES
    fig = Figure(figsize=(width * count, height * len(rows)))
    axes = fig.subplots(len(rows), count, squeeze=False)
    for r, (name, pictures, cmap) in enumerate(rows):
        for k in range(count):
            ax = axes[r][k]
            ax.imshow(pictures[k].numpy(), cmap=cmap, vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                true, guess = labels[k].tolist(), predicted[k].tolist()
                ok = sorted(true) == sorted(guess)
                ax.set_title(f"L {true[0]},{true[1]}\nR {guess[0]},{guess[1]}",
                             fontsize="small", color=RIGHT_COLOR if ok else WRONG_COLOR)
        axes[r][0].set_ylabel(name, fontsize="small")
    return save_figure(fig, path)
