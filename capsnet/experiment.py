"""The epoch loop shared by the robustness protocols (affNIST, MultiMNIST): Adam with a
per-epoch exponential decay, validation-selected ``best.pt``, an optional stop once the
validation accuracy reaches a target, and a run directory that describes itself
(config.json, command.txt, metrics.csv, last.pt, best.pt; the caller adds results.json).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from torch import nn

from capsnet.config import config_to_dict
from capsnet.training.checkpoint import save_checkpoint
from capsnet.training.metrics_log import MetricsLog

# train_epoch(epoch) -> metrics of the epoch, e.g. {'train_loss': ..., 'train_accuracy': ...}
TrainEpoch = Callable[[int], dict]
# validate() -> validation accuracy of the model in its current state
Validate = Callable[[], float]


def describe_run(run_dir: Path, settings: dict, model: nn.Module,
                 argv: Optional[list[str]] = None) -> None:
    """Write the resolved settings, the model config and the command line into ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(
        {"settings": settings, "model_config": config_to_dict(model.config)}, indent=2) + "\n")
    words = ["capsnet", *(argv if argv is not None else sys.argv[1:])]
    with open(run_dir / "command.txt", "a") as f:
        f.write(" ".join(words) + "\n")


def run_epochs(run_dir: Path, model: nn.Module, optimizer, scheduler, epochs: int,
               train_epoch: TrainEpoch, validate: Validate, settings: dict,
               target_accuracy: Optional[float] = None,
               log: Callable[[str], None] = print) -> dict:
    """Train for up to ``epochs`` epochs, checkpointing ``last.pt`` each epoch and
    ``best.pt`` when the validation accuracy improves; with ``target_accuracy``, stop after
    the first epoch whose validation accuracy reaches it (that epoch is then best.pt).
    Returns {'epochs', 'best_epoch', 'best_val_accuracy', 'reached_target'}."""
    state = {"epochs": 0, "best_epoch": None, "best_val_accuracy": -1.0, "reached_target": False}
    metrics = MetricsLog(run_dir, tensorboard=False)
    try:
        for epoch in range(1, epochs + 1):
            lr = optimizer.param_groups[0]["lr"]
            start = time.perf_counter()
            row = {"epoch": epoch, "lr": lr, **train_epoch(epoch)}
            row["epoch_seconds"] = round(time.perf_counter() - start, 3)
            row["val_accuracy"] = validate()
            scheduler.step()
            improved = row["val_accuracy"] > state["best_val_accuracy"]
            state["epochs"] = epoch
            if improved:
                state.update(best_epoch=epoch, best_val_accuracy=row["val_accuracy"])
            # Reaching the target implies improving: every earlier epoch was below it.
            reached = target_accuracy is not None and row["val_accuracy"] >= target_accuracy
            ckpt = dict(optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
                        train_settings=settings, metrics=row, **state)
            save_checkpoint(run_dir / "last.pt", model, **ckpt)
            if improved:
                save_checkpoint(run_dir / "best.pt", model, **ckpt)
            metrics.log(row)
            log(epoch_line(row, improved))
            if reached:
                state["reached_target"] = True
                log(f"validation accuracy {row['val_accuracy']:.4f} reached the target "
                    f"{target_accuracy:.4f}; stopping after epoch {epoch}")
                break
    finally:
        metrics.close()
    return state


def epoch_line(row: dict, best: bool) -> str:
    parts = [f"epoch {row['epoch']}"]
    parts += [f"{key.replace('_', ' ')} {row[key]:.4f}"
              for key in ("train_loss", "train_accuracy") if key in row]
    parts.append(f"val acc {row['val_accuracy']:.4f}" + (" (best)" if best else ""))
    parts.append(f"{row['epoch_seconds']:.1f}s")
    return " | ".join(parts)


def write_results(run_dir: Path, results: dict) -> Path:
    path = run_dir / "results.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    return path
