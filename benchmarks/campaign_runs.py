"""The pieces of benchmarks/gpu_campaign.py that move training runs forward under a time budget:
a deadline, one run's state read from its directory, one call that starts, resumes, finishes
or skips a run through the library's drivers, and compact summaries for the results JSON.

A run lives in its own directory (``last.pt``, ``best.pt``, ``metrics.csv``,
``results.json``), written by :func:`capsnet.training.runner.run_task`; nothing here trains.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from capsnet.checkpoint import load_checkpoint
from capsnet.export import export_weights
from capsnet.training.metrics_log import read_metrics
from capsnet.training.settings import TrainSettings, resumed_settings

MAX_FILE_BYTES = 16 * 2**20  # the largest file a device call brings back
CURVE_COLUMNS = ("epoch", "lr", "train_loss", "train_accuracy", "val_accuracy", "epoch_seconds",
                 "images_per_second")


@dataclass
class Budget:
    """A deadline on the monotonic clock, and what a run spends around its epochs: ``setup``
    seconds before its first epoch (data, speed plan) and ``final`` seconds for its test."""

    deadline: float
    setup: float = 0.0
    final: float = 0.0
    unknown_epoch: float = 0.0  # assumed length of an epoch no run has measured yet

    @classmethod
    def minutes(cls, minutes: float, **margins) -> Budget:
        return cls(time.monotonic() + 60.0 * minutes, **margins)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def capped(self, minutes: float | None) -> Budget:
        """The same margins with a deadline at most ``minutes`` from now."""
        if minutes is None:
            return self
        return dataclasses.replace(self, deadline=min(self.deadline,
                                                      time.monotonic() + 60.0 * minutes))

    def fits(self, epoch_seconds: float | None) -> bool:
        """Whether one more epoch (and a run's setup and test around it) fits."""
        epoch = self.unknown_epoch if epoch_seconds is None else epoch_seconds
        return self.left() >= self.setup + epoch + self.final

    def time_limit(self) -> float:
        """``TrainSettings.time_limit`` for a run started now: its epochs' share."""
        return max(0.0, self.left() - self.setup - self.final)


@dataclass
class RunSpec:
    """One training run of a stage: its directory, its settings (``epochs`` is the target),
    the library function that trains it (fit, train_affnist, train_multimnist), and the
    directories of runs of the same model whose epoch times predict this one's."""

    label: str
    run_dir: Path
    settings: TrainSettings
    train: Callable[..., dict]
    siblings: list[Path] = field(default_factory=list)


def read_results(run_dir: Path) -> dict | None:
    path = run_dir / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def read_curve(run_dir: Path) -> list[dict]:
    """The run's metrics.csv rows, with the columns worth bringing back."""
    if not (run_dir / "metrics.csv").is_file():
        return []
    return [{k: row[k] for k in CURVE_COLUMNS if row.get(k) is not None}
            for row in read_metrics(run_dir)]


def is_complete(results: dict | None) -> bool:
    """Tested once at the end (results of runs older than time limits have no 'complete')."""
    return results is not None and results.get("complete", True)


def is_done(spec: RunSpec, finish: bool) -> bool:
    """Nothing left to do for the run: tested, and at its epoch target or target accuracy
    (or, with ``finish``, tested wherever it ended)."""
    results = read_results(spec.run_dir)
    if not is_complete(results):
        return False
    return (finish or results.get("reached_target", False)
            or results["epochs"] >= spec.settings.epochs)


def epoch_estimate(dirs: list[Path]) -> float | None:
    """Seconds the next epoch is likely to take (validation included): the last epoch
    measured in the first of ``dirs`` that has one, a tenth and a second more."""
    for run_dir in dirs:
        curve = read_curve(run_dir)
        if curve and curve[-1].get("epoch_seconds") is not None:
            return 1.1 * curve[-1]["epoch_seconds"] + 1.0
    return None


def advance(spec: RunSpec, budget: Budget, finish: bool, log: Callable[[str], None],
            argv: list[str], test_at_end: bool = False) -> str:
    """Move ``spec``'s run forward as far as ``budget`` allows: skip it when it is done,
    start it, or resume it from ``last.pt`` (the runner's ``time_limit`` stops it before an
    epoch would overrun the budget). With ``finish`` (or ``test_at_end``, which does not
    count a run tested short of its target as done), a run left incomplete is tested where
    it stands. Returns what happened, in a few words."""
    if is_done(spec, finish):
        return "done before this call (skipped)"
    last = spec.run_dir / "last.pt"
    estimate = epoch_estimate([spec.run_dir, *spec.siblings])
    test_here = finish or test_at_end
    if test_here:  # a second start-up, for the test where the run stands
        budget = dataclasses.replace(budget, deadline=budget.deadline - budget.setup)
    action = "not started: no time left in the budget"
    if budget.fits(estimate):
        results = _train(spec, budget.time_limit(), last, log, argv)
        action = (f"trained to epoch {results['epochs']}"
                  + ("" if results["complete"] else " (stopped by the time limit)"))
    elif last.exists():
        action = "waiting: no time left for another epoch"
    if test_here and last.exists() and not is_complete(read_results(spec.run_dir)):
        epoch = load_checkpoint(last)["epoch"]
        _train(dataclasses.replace(spec, settings=dataclasses.replace(spec.settings,
                                                                      epochs=epoch)),
               None, last, log, argv)
        action += f"; finished at epoch {epoch} and tested"
    return action


def _train(spec: RunSpec, time_limit: float | None, last: Path, log, argv) -> dict:
    """One call of the run's library driver: a fresh start, or a resume of ``last``."""
    settings = dataclasses.replace(spec.settings, time_limit=time_limit, progress=False,
                                   out_dir=str(spec.run_dir))
    if not last.exists():
        return spec.train(settings, argv=argv, log=log)
    settings = resumed_settings(last, settings, also_given=("compile",),
                                out_dir=str(spec.run_dir))
    return spec.train(settings, resume=str(last), argv=argv, log=log)


def run_summary(spec: RunSpec) -> dict:
    """Where a run stands, for the results JSON: epochs, selection, test results when it
    is complete, epoch times and the per-epoch curve."""
    results = read_results(spec.run_dir) or {}
    curve = read_curve(spec.run_dir)
    done = max([results.get("epochs", 0), *(row["epoch"] for row in curve)])
    seconds = [row["epoch_seconds"] for row in curve if "epoch_seconds" in row]
    summary = {"label": spec.label, "run_dir": str(spec.run_dir), "epochs_done": done,
               "epochs_target": spec.settings.epochs, "complete": is_complete(results or None),
               "best_epoch": results.get("best_epoch"),
               "best_val_accuracy": results.get("best_val_accuracy"),
               "reached_target": results.get("reached_target"),
               "mean_epoch_seconds": sum(seconds) / len(seconds) if seconds else None,
               "last_epoch_seconds": seconds[-1] if seconds else None}
    if summary["best_val_accuracy"] is None and curve:
        scores = [(row["val_accuracy"], row["epoch"]) for row in curve if "val_accuracy" in row]
        if scores:
            summary["best_val_accuracy"], summary["best_epoch"] = max(scores)
    if summary["complete"]:  # a protocol's 'test', or the recipe's 'best' and 'final' epochs
        summary["test"] = (_headline(results["test"]) if "test" in results else
                           {k: _headline(results[k]) for k in ("best", "final") if k in results})
    summary["curve"] = curve
    return summary


def _headline(value):
    """A test result without its confusion matrix and per-class lists."""
    if not isinstance(value, dict):
        return value
    return {k: v for k, v in value.items() if not isinstance(v, (list, dict))}


def export_selected(checkpoint: Path, work_path: Path, out_path: Path, info: dict) -> dict:
    """float16 safetensors of ``checkpoint`` (the validation-selected model), written in the
    work directory and copied to ``out_path`` when it is small enough to come back."""
    export_weights(checkpoint, work_path, info=info)
    size = work_path.stat().st_size
    if size > MAX_FILE_BYTES:
        return {"file": None, "bytes": size,
                "reason": f"{size / 2**20:.1f} MiB of float16 weights, over the "
                          f"{MAX_FILE_BYTES // 2**20} MiB a file may bring back; kept in "
                          f"{work_path}"}
    shutil.copyfile(work_path, out_path)
    return {"file": out_path.name, "bytes": size, "checkpoint": str(checkpoint)}
