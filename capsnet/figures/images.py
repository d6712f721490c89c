"""Pictures made of images: the paper's test images over their reconstructions (Figure 3),
each pose dimension of a capsule perturbed (Figure 4), MultiMNIST pairs and their two
reconstructions (Figure 5); one prediction, an attack's diagnosis view (a clean and an
adversarial image, their reconstructions from the true and the adversarial class's capsule,
and the class scores of both), and example digits of transformed test sets."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from capsnet.data.image_dataset import PIXEL_MAX, display_images
from capsnet.figures.common import (
    OTHER_COLOR,
    RIGHT_COLOR,
    WINNER_COLOR,
    WRONG_COLOR,
    class_label,
    draw_image,
    mosaic,
    save_figure,
    short_label,
    show_image,
)
from capsnet.inference import to_uint8

CELL_INCHES = 0.9  # side of one digit in the reconstruction grid
GRID_CELL_INCHES = 0.32  # side of one digit in the manipulation grid
MARGIN_INCHES = 0.7  # room for tick labels and titles
PAIR_INCHES = (1.3, 1.45)  # per pair: width, height of a row
PANEL_INCHES = 1.6  # per panel of the diagnosis view
DIAGNOSIS_PANELS = 4  # image, reconstruction (true), reconstruction (adversarial), scores
EXAMPLE_INCHES = (1.0, 1.1)  # per image: width, height of a row


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
    _score_bars(axes[-1], lengths)
    if class_names and any(name != str(j) for j, name in enumerate(class_names)):
        axes[-1].set_xticklabels([short_label(n) for n in class_names], rotation=90, fontsize=7)
    axes[-1].set_title("capsule lengths", fontsize=8)
    return save_figure(fig, path, title)


def diagnosis_figure(view: dict[str, torch.Tensor], path: str | os.PathLike,
                     count: int = 4, title: str = "") -> Path:
    """For each of ``count`` examples of a :func:`capsnet.attacks.capsule.diagnosis` view,
    two rows (clean, adversarial): the image, its reconstructions from the true and the
    adversarial class's capsule, and its class scores as bars."""
    count = min(count, len(view["labels"]))
    fig = Figure(figsize=(PANEL_INCHES * DIAGNOSIS_PANELS, PANEL_INCHES * 2 * count))
    axes = fig.subplots(2 * count, DIAGNOSIS_PANELS, squeeze=False)
    for i in range(count):
        true, adv = int(view["labels"][i]), int(view["adversarial_class"][i])
        for k, name in enumerate(("clean", "adversarial")):
            row = axes[2 * i + k]
            show_image(row[0], to_uint8(view[name][i]), f"{name} (true {true})",
                       WRONG_COLOR if name == "adversarial" and adv != true else RIGHT_COLOR)
            for col, which, cls in ((1, "true", true), (2, "adversarial", adv)):
                recon = view.get(f"{name}_reconstruction_{which}")
                if recon is None:
                    row[col].axis("off")
                    continue
                show_image(row[col], to_uint8(recon[i]), f"recon. as {cls}")
            _score_bars(row[3], view[f"{name}_scores"][i].cpu().numpy())
            row[3].tick_params(labelsize=6)
            if i == 0 and k == 0:
                row[3].set_title("class scores", fontsize=8)
    fig.subplots_adjust(hspace=0.45)
    return save_figure(fig, path, title)


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


def _score_bars(ax, scores: Sequence[float]) -> None:
    """Class scores (J,) in [0, 1] as bars, the highest in the winner's colour."""
    winner = int(np.argmax(scores))
    ax.bar(range(len(scores)), scores,
           color=[WINNER_COLOR if j == winner else OTHER_COLOR for j in range(len(scores))])
    ax.set_xticks(range(len(scores)))
    ax.set_ylim(0, 1)
