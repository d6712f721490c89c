"""Models compared at the same validation accuracy, as in the paper's affNIST experiment: from
each run directory, the earliest kept checkpoint (last.pt, best.pt, epoch-NNN.pt) whose
recorded validation accuracy reaches a common level, read without loading the weights."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from capsnet.checkpoint import CheckpointError, load_checkpoint


@dataclass(frozen=True)
class KeptCheckpoint:
    """A checkpoint file of a run with the epoch it was saved after."""

    path: Path
    epoch: int
    val_accuracy: float


def kept_checkpoints(run_dir: str | Path) -> list[KeptCheckpoint]:
    """The run's checkpoints that record a validation accuracy, one per epoch, by epoch."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: not a run directory")
    by_epoch: dict[int, KeptCheckpoint] = {}
    # epoch-NNN.pt first: the file that stays when last.pt and best.pt move on
    for path in sorted(run_dir.glob("*.pt"), key=lambda p: (not p.name.startswith("epoch"),
                                                             p.name)):
        payload = load_checkpoint(path, mmap=True)
        accuracy = payload.get("metrics", {}).get("val_accuracy")
        epoch = payload.get("epoch")
        if accuracy is not None and epoch is not None and epoch not in by_epoch:
            by_epoch[epoch] = KeptCheckpoint(path, int(epoch), float(accuracy))
    if not by_epoch:
        raise CheckpointError(f"{run_dir}: no checkpoint with a validation accuracy (train "
                              f"with a validation split)")
    return [by_epoch[epoch] for epoch in sorted(by_epoch)]


def matched_checkpoints(run_dirs: Sequence[str | Path],
                        accuracy: float | None = None) -> tuple[float, list[KeptCheckpoint]]:
    """(level, each run's earliest checkpoint reaching ``accuracy``, by default the highest
    level every run reached); ValueError naming a run that never reached it."""
    runs = [kept_checkpoints(run_dir) for run_dir in run_dirs]
    bests = [max(kept.val_accuracy for kept in run) for run in runs]
    level = min(bests) if accuracy is None else accuracy
    chosen = []
    for run_dir, run, best in zip(run_dirs, runs, bests, strict=True):
        reaching = [kept for kept in run if kept.val_accuracy >= level]
        if not reaching:
            raise ValueError(f"{run_dir}: no kept checkpoint reaches validation accuracy "
                             f"{level:.4f} (its best is {best:.4f})")
        chosen.append(reaching[0])
    return level, chosen


def describe_match(level: float, chosen: Sequence[KeptCheckpoint]) -> str:
    """One line per model: which checkpoint stands for it at the common level."""
    lines = [f"matched at validation accuracy >= {level:.4f}:"]
    lines += [f"  {kept.path} (epoch {kept.epoch}, validation {kept.val_accuracy:.4f})"
              for kept in chosen]
    return "\n".join(lines)
