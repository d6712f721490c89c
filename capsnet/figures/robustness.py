"""Figures of the robustness experiments: accuracy against rotation and against attack
strength (eps), and example test digits of each transformed set."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from capsnet.data.image_dataset import display_images
from capsnet.experiments.robustness import AFFINE, ROTATION
from capsnet.figures.common import PERCENT, save_figure, show_image

CHART_INCHES = (7, 4.5)
EXAMPLE_INCHES = (1.0, 1.1)  # per image: width, height of a row


def rotation_figure(rows: Sequence[dict], path: str | os.PathLike, title: str = "") -> Path:
    """Accuracy against rotation angle, a line per model, its affine accuracy dotted."""
    fig, ax = _accuracy_chart("rotation angle (degrees, counter-clockwise)", "test accuracy (%)",
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


def accuracy_eps_figure(rows: Sequence[dict], path: str | os.PathLike, title: str = "") -> Path:
    """Robust accuracy against eps, one line per model and attack (and loss), starting
    from the clean accuracy at eps 0."""
    fig, ax = _accuracy_chart("eps (L-inf or L2, as the attack's norm)", "robust accuracy (%)",
                              title)
    curves: dict[str, list[dict]] = {}
    for r in rows:
        curves.setdefault(f"{r['model']}: {r['attack']} ({r['loss']})", []).append(r)
    for label, mine in curves.items():
        mine = sorted(mine, key=lambda r: r["eps"])
        eps = [0.0] + [r["eps"] for r in mine]  # eps 0: the clean accuracy
        accuracy = [mine[0]["clean_accuracy"]] + [r["robust_accuracy"] for r in mine]
        ax.plot(eps, [PERCENT * a for a in accuracy], marker="o", label=label)
    ax.legend(fontsize="small")
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


def _accuracy_chart(xlabel: str, ylabel: str, title: str = "") -> tuple[Figure, Axes]:
    """An empty chart (figure, axes) with a 0-100% y axis and a light grid, titled if given."""
    fig = Figure(figsize=CHART_INCHES)
    ax = fig.subplots()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, PERCENT)
    ax.grid(True, alpha=0.3)
    if title:
        ax.set_title(title, fontsize="medium")
    return fig, ax
