"""The test-set class scores of a run's tested model (``test_scores.npy`` (N, J) float32 and
``test_labels.npy`` (N,) int64 beside results.json), and ensembles recomputed from them
without the weights."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

SCORES_FILE = "test_scores.npy"
LABELS_FILE = "test_labels.npy"


def save_test_scores(run_dir: str | Path, scores: torch.Tensor, labels: torch.Tensor) -> None:
    """Write scores (N, J) as float32 and labels (N,) as int64 into ``run_dir``."""
    run_dir = Path(run_dir)
    np.save(run_dir / SCORES_FILE, scores.detach().float().cpu().numpy())
    np.save(run_dir / LABELS_FILE, labels.detach().long().cpu().numpy())


def has_test_scores(run_dir: str | Path) -> bool:
    return all((Path(run_dir) / name).is_file() for name in (SCORES_FILE, LABELS_FILE))


def load_test_scores(run_dir: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """A run's saved (scores (N, J) float32, labels (N,) int64)."""
    run_dir = Path(run_dir)
    scores, labels = np.load(run_dir / SCORES_FILE), np.load(run_dir / LABELS_FILE)
    if scores.ndim != 2 or labels.shape != scores.shape[:1]:
        raise ValueError(f"{run_dir}: test scores {scores.shape} do not match labels "
                         f"{labels.shape}")
    return scores, labels


def error_of(scores: np.ndarray, labels: np.ndarray) -> float:
    """Test error of the highest scores (N, J) against labels (N,)."""
    return float((scores.argmax(axis=1) != labels).mean())


def ensemble_from_runs(run_dirs: Sequence[str | Path]) -> dict:
    """The ensemble of ``run_dirs`` (averaged test scores): its error, its size and each
    run's own error; the runs must have scored the same test images in order."""
    if not run_dirs:
        raise ValueError("an ensemble needs at least one run")
    total, first_labels, errors = None, None, []
    for run_dir in run_dirs:
        scores, labels = load_test_scores(run_dir)  # (N, J), (N,)
        if first_labels is None:
            first_labels = labels
        elif not np.array_equal(labels, first_labels):
            raise ValueError(f"{run_dir}: its test labels differ from {run_dirs[0]}'s: not "
                             f"the same test set")
        errors.append(error_of(scores, labels))
        total = scores.astype(np.float64) if total is None else total + scores
    return {"ensemble_test_error": error_of(total / len(run_dirs), first_labels),
            "ensemble_size": len(run_dirs), "member_test_errors": errors}
