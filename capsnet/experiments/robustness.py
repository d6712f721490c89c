"""Accuracy of several models on the same transformed test digits: a rotation sweep and a
seeded affine set, made at each model's input size (centred on its canvas, then transformed).
"""
from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from capsnet import writers
from capsnet.atomic import atomic_write
from capsnet.data.transforms import AffineRanges, affine_set, rotate
from capsnet.models import model_name_of
from capsnet.training.loop import evaluate

ROTATION, AFFINE = "rotation", "affine"
CSV_COLUMNS = ("model", "input_size", "transform", "angle_deg", "images", "accuracy", "error")
DIGITS = 6  # decimals kept for accuracies


@dataclass
class NamedModel:
    """A model in eval mode with the label it gets in tables and plots."""

    label: str
    model: nn.Module

    @property
    def image_size(self) -> int:
        return self.model.config.image_size


def named_models(paths: Sequence[str], models: Sequence[nn.Module],
                 given: Sequence[str] | None = None) -> list[NamedModel]:
    """The models with their labels for tables and plots: ``given``, or 'capsnet (run-dir)'
    from each model's name and its checkpoint's folder."""
    if given and len(given) != len(paths):
        raise ValueError(f"{len(given)} labels for {len(paths)} checkpoints")
    labels = list(given) if given else []
    if not given:
        for path, model in zip(paths, models, strict=False):
            label = f"{model_name_of(model.config)} ({Path(path).resolve().parent.name})"
            labels.append(label if label not in labels else f"{label} #{len(labels) + 1}")
    return [NamedModel(label, model) for label, model in zip(labels, models, strict=False)]


def input_size_check(models: Sequence[NamedModel], image_size: int) -> None:
    """Raise ValueError unless every model takes images at least ``image_size`` square."""
    for m in models:
        if m.image_size < image_size:
            raise ValueError(f"{m.label} takes {m.image_size}x{m.image_size} images, smaller "
                             f"than the {image_size}x{image_size} test digits")


def rotation_rows(models: Sequence[NamedModel], images: torch.Tensor, labels: torch.Tensor,
                  angles: Sequence[float], batch_size: int = 500) -> list[dict]:
    """One row per (model, angle): accuracy on ``images`` (N, H, W) uint8 turned by the angle."""
    return [row for angle in angles for row in _rows(
        models, labels, lambda size, angle=angle: rotate(images, angle, out_size=size),
        ROTATION, angle, batch_size)]


def affine_rows(models: Sequence[NamedModel], images: torch.Tensor, labels: torch.Tensor,
                ranges: AffineRanges = AffineRanges(), seed: int = 0,
                batch_size: int = 500) -> list[dict]:
    """One row per model: accuracy on the seeded affine set of ``images`` (N, H, W)."""
    return _rows(models, labels, lambda size: affine_set(images, ranges, seed, out_size=size),
                 AFFINE, None, batch_size)


def _rows(models: Sequence[NamedModel], labels: torch.Tensor, transformed, transform: str,
          angle: float | None, batch_size: int) -> list[dict]:
    """One row per model: accuracy on ``transformed(input size)`` (N, S, S), made once a size."""
    sets: dict[int, torch.Tensor] = {}
    rows = []
    for m in models:
        if m.image_size not in sets:
            sets[m.image_size] = transformed(m.image_size)
        accuracy = evaluate(m.model, sets[m.image_size], labels, batch_size=batch_size).accuracy
        rows.append({"model": m.label, "input_size": m.image_size, "transform": transform,
                     "angle_deg": angle, "images": len(labels),
                     "accuracy": round(accuracy, DIGITS), "error": round(1.0 - accuracy, DIGITS)})
    return rows


def write_csv(rows: Sequence[dict], path: str | os.PathLike) -> Path:
    """Rows as CSV with :data:`CSV_COLUMNS` (an affine row has an empty angle), atomically."""
    def write(f) -> None:
        writer = csv.DictWriter(f, CSV_COLUMNS)
        writer.writeheader()
        writer.writerows({k: ("" if row[k] is None else row[k]) for k in CSV_COLUMNS}
                         for row in rows)

    atomic_write(path, write, mode="w")
    return Path(path)


def accuracy_grid(rows: Sequence[dict], affine_label: str = "affine"
                  ) -> tuple[list[str], list[tuple[str, list]]]:
    """The rows rearranged as (model labels, [(test-set name, accuracy per model or None)]):
    one line per rotation angle in order, then the affine set."""
    labels = list(dict.fromkeys(r["model"] for r in rows))
    table = {(r["model"], r["transform"], r["angle_deg"]): r["accuracy"] for r in rows}
    angles = list(dict.fromkeys(r["angle_deg"] for r in rows if r["transform"] == ROTATION))
    keys = [(ROTATION, a, f"rotated {a:+g} deg") for a in angles]
    if any(r["transform"] == AFFINE for r in rows):
        keys.append((AFFINE, None, affine_label))
    return labels, [(name, [table.get((label, transform, angle)) for label in labels])
                    for transform, angle, name in keys]


def format_table(rows: Sequence[dict], affine_label: str = "affine") -> str:
    """Plain-text accuracy table (percent): a line per test set, a column per model."""
    labels, lines = accuracy_grid(rows, affine_label)
    width = max([len(label) for label in labels] + [len("100.00")])
    first = max(len(name) for name, _ in lines)
    out = [" ".join([" " * first] + [f"{label:>{width}}" for label in labels])]
    for name, cells in lines:
        out.append(" ".join([f"{name:<{first}}"] + [
            f"{'-':>{width}}" if c is None else f"{100 * c:>{width}.2f}" for c in cells]))
    return "\n".join(out)


def markdown_table(rows: Sequence[dict], affine_label: str = "affine") -> str:
    """The same table in Markdown (accuracy in percent)."""
    labels, lines = accuracy_grid(rows, affine_label)
    return writers.markdown_table(["test set", *labels], [
        [name, *("-" if c is None else f"{100 * c:.2f}%" for c in cells)]
        for name, cells in lines])
