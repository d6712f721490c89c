"""The paper's pictures of what capsules hold: test images over their reconstructions
(Figure 3), each pose dimension of a capsule perturbed (Figure 4), and one prediction."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from capsnet.figures.common import (
    RIGHT_COLOR,
    WRONG_COLOR,
    class_label,
    draw_image,
    mosaic,
    save_figure,
    score_bars,
    short_label,
    show_image,
)

CELL_INCHES = 0.9  # side of one digit in the reconstruction grid
GRID_CELL_INCHES = 0.32  # side of one digit in the manipulation grid
MARGIN_INCHES = 0.7  # room for tick labels and titles


def reconstruction_figure(images: np.ndarray, reconstructions: np.ndarray, labels: Sequence[int],
                          predictions: Sequence[int], path: str | os.PathLike, columns: int = 10,
                          label_reconstructions: np.ndarray | None = None,
                          class_names: Sequence[str] | None = None) -> Path:
    """Figure 3: inputs (N, H, W[, 3]) uint8 over their reconstructions from the predicted
    capsule, titled 'label -> prediction', errors in red; ``label_reconstructions`` adds,
    for errors, the reconstruction from the true label's capsule."""
    N = len(images)
    columns = max(1, min(columns, N))
    chunks = -(-N // columns)  # ceil
    wrong = [int(label) != int(p) for label, p in zip(labels, predictions, strict=True)]
    rows = 3 if label_reconstructions is not None and any(wrong) else 2
    title_rows = 1.5 if class_names else 1.2  # names take two title lines
    arrow = " \u2192\n" if class_names else " \u2192 "
    fig = Figure(figsize=(columns * CELL_INCHES, rows * chunks * CELL_INCHES * title_rows),
                 layout="constrained")
    axes = fig.subplots(rows * chunks, columns, squeeze=False)
    for i in range(N):
        row, col = rows * (i // columns), i % columns
        label, guess = (class_label(k, class_names) for k in (labels[i], predictions[i]))
        show_image(axes[row, col], images[i], label + arrow + guess,
                   WRONG_COLOR if wrong[i] else RIGHT_COLOR)
        show_image(axes[row + 1, col], reconstructions[i])
        if rows == 3 and wrong[i]:
            show_image(axes[row + 2, col], label_reconstructions[i])
    names = ["input", "from prediction", "from label"][:rows]
    for row in range(0, rows * chunks, rows):
        for r, name in enumerate(names):
            axes[row + r, 0].set_ylabel(name, fontsize=8)
    for ax in axes.ravel():
        if not ax.images:  # past the last image, or no third row for a right prediction
            ax.axis("off")
    return save_figure(fig, path, "Test images (label \u2192 prediction) over their "
                       "reconstructions; red: mis-classified")


def manipulation_figure(grids: Sequence[np.ndarray], digits: Sequence[int | str],
                        deltas: Sequence[float], path: str | os.PathLike) -> Path:
    """Figure 4: per class a grid (D, S, H, W[, 3]) uint8, row d with dimension d moved by
    each of the S ``deltas``; titled 'digit 7' for an index, by the name otherwise."""
    D, S = grids[0].shape[:2]
    fig = Figure(figsize=(len(grids) * (S * GRID_CELL_INCHES + MARGIN_INCHES),
                          D * GRID_CELL_INCHES + 2 * MARGIN_INCHES), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(grids), squeeze=False)[0])
    for ax, grid, digit in zip(axes, grids, digits, strict=True):
        H, W = grid.shape[2:4]
        draw_image(ax, mosaic(grid))
        ax.set_title(f"digit {digit}" if isinstance(digit, int) else str(digit), fontsize=9)
        ax.set_xticks([s * (W + 1) + W / 2 for s in range(S)])
        ax.set_xticklabels([f"{d:+.2f}" for d in deltas], rotation=90, fontsize=6)
        ax.set_yticks([d * (H + 1) + H / 2 for d in range(D)])
        ax.set_yticklabels([str(d) for d in range(D)], fontsize=6)
        ax.set_xlabel("perturbation", fontsize=8)
    axes[0].set_ylabel("capsule dimension", fontsize=8)
    return save_figure(fig, path, "Each dimension of the winning capsule perturbed, then decoded")


def prediction_figure(image: np.ndarray, reconstruction: np.ndarray | None,
                      lengths: Sequence[float], title: str, path: str | os.PathLike,
                      class_names: Sequence[str] | None = None) -> Path:
    """An input (H, W[, 3]) uint8, its reconstruction or None, and the capsule lengths (J,)."""
    panels = 3 if reconstruction is not None else 2
    fig = Figure(figsize=(3 * panels, 3))
    axes = fig.subplots(1, panels)
    show_image(axes[0], image, "input as the model saw it")
    if reconstruction is not None:
        show_image(axes[1], reconstruction, "reconstruction")
    score_bars(axes[-1], lengths)
    if class_names and any(name != str(j) for j, name in enumerate(class_names)):
        axes[-1].set_xticklabels([short_label(n) for n in class_names], rotation=90, fontsize=7)
    axes[-1].set_title("capsule lengths", fontsize=8)
    return save_figure(fig, path, title)
