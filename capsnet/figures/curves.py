"""Training curves: loss and error per epoch from a run's metrics.csv."""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from capsnet.figures.common import PERCENT, save_figure

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
    if title:
        fig.suptitle(title, fontsize=9)
    return save_figure(fig, path)
