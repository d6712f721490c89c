"""Per-epoch metrics: a CSV file always, TensorBoard too when it is installed."""
from __future__ import annotations

import contextlib
import csv
from pathlib import Path


class MetricsLog:
    """Appends one row per epoch to ``run_dir/metrics.csv`` (columns fixed by the first row)."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True):
        self.path = Path(run_dir) / "metrics.csv"
        self.columns: list[str] | None = None
        if self.path.exists():
            with open(self.path, newline="") as f:
                self.columns = next(csv.reader(f), None)
        self.writer = _tensorboard_writer(run_dir) if tensorboard else None

    def log(self, row: dict) -> None:
        if self.columns is None:
            self.columns = list(row)
            with open(self.path, "w", newline="") as f:
                csv.writer(f).writerow(self.columns)
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self.columns, extrasaction="ignore").writerow(row)
        if self.writer is not None:
            for key, value in row.items():
                if key != "epoch" and isinstance(value, (int, float)) and value == value:
                    self.writer.add_scalar(key, value, row["epoch"])
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(run_dir: str | Path) -> list[dict]:
    """Rows of a run's metrics.csv with numbers parsed (empty cells become None)."""
    with open(Path(run_dir) / "metrics.csv", newline="") as f:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _number(text: str):
    """A CSV cell as an int, a float, None when empty, else the text."""
    for parse in (int, float):
        with contextlib.suppress(ValueError):
            return parse(text)
    return None if text == "" else text


def _tensorboard_writer(run_dir):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # tensorboard is optional
        return None
    return SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))
