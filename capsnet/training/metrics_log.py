"""Per-epoch metrics: a CSV file always, TensorBoard too when it is installed."""
from __future__ import annotations

import contextlib
import csv
import io
from pathlib import Path

from capsnet.atomic import append_text, write_text

METRICS_FILE = "metrics.csv"


def log_metrics(run_dir: str | Path, row: dict, tensorboard=None) -> None:
    """Add one epoch's ``row`` to ``run_dir/metrics.csv`` (columns fixed by its first row;
    the file rewritten whole, atomically: never half a row) and to the ``tensorboard``
    writer if any (:func:`tensorboard_writer`)."""
    path = Path(run_dir) / METRICS_FILE
    lines = io.StringIO()
    columns = None
    if path.exists():
        with open(path, newline="") as f:
            columns = next(csv.reader(f), None)
    if columns is None:
        columns = list(row)
        csv.writer(lines, lineterminator="\n").writerow(columns)
    csv.DictWriter(lines, columns, extrasaction="ignore", lineterminator="\n").writerow(row)
    append_text(path, lines.getvalue())
    if tensorboard is not None:
        for key, value in row.items():
            if key != "epoch" and isinstance(value, (int, float)) and value == value:
                tensorboard.add_scalar(key, value, row["epoch"])
        tensorboard.flush()


def trim_metrics(run_dir: str | Path, last_epoch: int) -> None:
    """Drop the rows of epochs after ``last_epoch`` (a resume redoes them), if any."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return
    rows = read_metrics(run_dir)
    if all(row["epoch"] <= last_epoch for row in rows):
        return
    with open(path, newline="") as f:
        lines = f.read().splitlines(keepends=True)
    kept = [lines[0]] + [line for line, row in zip(lines[1:], rows, strict=True)
                         if row["epoch"] <= last_epoch]
    write_text(path, "".join(kept))


def read_metrics(run_dir: str | Path) -> list[dict]:
    """Rows of a run's metrics.csv with numbers parsed (empty cells become None)."""
    with open(Path(run_dir) / METRICS_FILE, newline="") as f:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]


def _number(text: str):
    """A CSV cell as an int, a float, None when empty, else the text."""
    for parse in (int, float):
        with contextlib.suppress(ValueError):
            return parse(text)
    return None if text == "" else text


def tensorboard_writer(run_dir: str | Path):
    """A TensorBoard SummaryWriter into ``run_dir/tensorboard``; None without TensorBoard."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # tensorboard is optional
        return None
    return SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))
