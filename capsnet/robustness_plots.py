"""Figures for the robustness experiments (matplotlib, Agg backend, PNG files)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import torch

from capsnet.experiments.robustness import AFFINE, ROTATION

FIGURE_DPI = 120
PERCENT = 100.0


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=FIGURE_DPI, bbox_inches="tight")
    _pyplot().close(fig)
    return path


def plot_rotation(rows: Sequence[dict], path: str | os.PathLike, title: str = "") -> Path:
    """Accuracy against rotation angle, one line per model on one chart; each model's
    accuracy on the affine set is a dotted line of the same colour."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = list(dict.fromkeys(r["model"] for r in rows))
    for index, label in enumerate(labels):
        color = f"C{index}"
        mine = [r for r in rows if r["model"] == label and r["transform"] == ROTATION]
        mine.sort(key=lambda r: r["angle_deg"])
        ax.plot([r["angle_deg"] for r in mine], [PERCENT * r["accuracy"] for r in mine],
                marker="o", color=color, label=f"{label}: rotated")
        for r in rows:
            if r["model"] == label and r["transform"] == AFFINE:
                ax.axhline(PERCENT * r["accuracy"], color=color, linestyle=":",
                           label=f"{label}: affine set ({PERCENT * r['accuracy']:.1f}%)")
    ax.set_xlabel("rotation angle (degrees, counter-clockwise)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, PERCENT)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", loc="lower center")
    if title:
        ax.set_title(title, fontsize="medium")
    return _save(fig, path)


def plot_examples(sets: dict[str, torch.Tensor], path: str | os.PathLike,
                  count: int = 10) -> Path:
    """A row of ``count`` images for each named set of images (N, H, W) uint8."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(sets), count, figsize=(count, 1.1 * len(sets)), squeeze=False)
    for row, (name, images) in enumerate(sets.items()):
        for col in range(count):
            ax = axes[row][col]
            ax.imshow(images[col].cpu().numpy(), cmap="gray", vmin=0, vmax=255)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[row][0].set_ylabel(name, rotation=0, ha="right", va="center", fontsize="small")
    return _save(fig, path)


def plot_pairs(images: torch.Tensor, first: torch.Tensor, second: torch.Tensor,
               labels: torch.Tensor, predicted: torch.Tensor, path: str | os.PathLike) -> Path:
    """MultiMNIST pairs and their two separate reconstructions (as in the paper's Figure 5).

    images (K, H, W) uint8 overlays; first, second (K, H, W) float in [0, 1], the decoder's
    reconstructions from the two most active capsules; labels (K, 2) true digits,
    predicted (K, 2) the two most active capsules. Rows: input, first reconstruction (red),
    second reconstruction (green), both over each other.
    """
    plt = _pyplot()
    count = images.shape[0]
    first, second = first.float().cpu().clamp(0, 1), second.float().cpu().clamp(0, 1)
    dark = torch.zeros_like(first)  # (K, H, W)
    rows = [("input", images.float().cpu() / 255, "gray"),
            ("capsule 1", torch.stack([first, dark, dark], -1), None),  # (K, H, W, 3) red
            ("capsule 2", torch.stack([dark, second, dark], -1), None),  # green
            ("both", torch.stack([first, second, dark], -1), None)]
    fig, axes = plt.subplots(len(rows), count, figsize=(1.3 * count, 1.45 * len(rows)),
                             squeeze=False)
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
                             fontsize="small", color="black" if ok else "red")
        axes[r][0].set_ylabel(name, fontsize="small")
    return _save(fig, path)
