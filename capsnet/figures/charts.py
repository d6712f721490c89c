"""Line charts: loss and error per epoch from a run's metrics.csv, and test accuracy against
rotation angle and against attack strength (eps)."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from capsnet.experiments.robustness import AFFINE, ROTATION
from capsnet.figures.common import PERCENT, save_figure

ACCURACY_INCHES = (7, 4.5)

# metrics.csv columns drawn by training_curves_figure: (column, panel, legend label).
CURVES = [
    ("train_loss", "loss", "train"),
    ("val_loss", "loss", "validation"),
    ("train_accuracy", "error", "train"),
    ("val_accuracy", "error", "validation"),
    ("test_accuracy_monitoring", "error", "test (monitoring only)"),
]


def curve_series(rows: Sequence[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """(epochs, values) per CURVES column in ``rows``; accuracies become error rates in percent."""
    series = {}
    for column, panel, _ in CURVES:
        points = [(row["epoch"], row[column]) for row in rows
                  if isinstance(row.get(column), (int, float))]
        if not points:
            continue
        epochs = [int(e) for e, _ in points]
        values = [float(v) for _, v in points]
        if panel == "error":
            values = [PERCENT * (1.0 - v) for v in values]
        series[column] = (epochs, values)
    return series


def training_curves_figure(rows: Sequence[dict], path: str | os.PathLike,
                           title: str | None = None) -> Path:
    """Loss and error rate (%, log scale) per epoch from a run's metrics rows."""
    series = curve_series(rows)
    if not series:
        raise ValueError("no loss or accuracy columns with values in the metrics log")
    fig = Figure(figsize=(10, 4))
    loss_ax, error_ax = fig.subplots(1, 2)
    panels = {"loss": loss_ax, "error": error_ax}
    for column, panel, label in CURVES:
        if column in series:
            epochs, values = series[column]
            panels[panel].plot(epochs, values, marker="o", markersize=3, label=label)
    loss_ax.set_ylabel("loss (margin + weighted reconstruction)")
    error_ax.set_ylabel("error rate (%)")
    for ax in panels.values():
        ax.set_xlabel("epoch")
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
            if all(v > 0 for line in ax.lines for v in line.get_ydata()):
                ax.set_yscale("log")
    return save_figure(fig, path, title)


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


def _accuracy_chart(xlabel: str, ylabel: str, title: str = "") -> tuple[Figure, Axes]:
    """An empty chart (figure, axes) with a 0-100% y axis and a light grid, titled if given."""
    fig = Figure(figsize=ACCURACY_INCHES)
    ax = fig.subplots()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, PERCENT)
    ax.grid(True, alpha=0.3)
    if title:
        ax.set_title(title, fontsize="medium")
    return fig, ax
