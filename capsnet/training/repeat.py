"""One recipe over several seeds: mean and standard deviation of the test errors and the
ensemble's error (averaged class scores, capsule lengths for CapsNets), from each run's saved
test scores (``test_scores.npy`` (N, J) float32, ``test_labels.npy`` (N,) int64) or, without
them, its checkpoint. A repeat continues where it stopped."""
from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from capsnet.atomic import write_json
from capsnet.checkpoint import model_from_checkpoint
from capsnet.data.model_view import load_test_set
from capsnet.devices import pick_device
from capsnet.training.distributed import env_ranks
from capsnet.training.fit import LABELS_FILE, SCORES_FILE, fit
from capsnet.training.loop import predict_scores
from capsnet.training.settings import RESUME_OVERRIDES, TrainSettings, resumed_settings

# Settings a seed's run directory may hold with other values and still be the same run.
NOT_THE_RECIPE = (*RESUME_OVERRIDES, "out_dir", "data_dir", "download", "compile", "cuda_graph",
                  "seed")


def repeat_recipe(settings: TrainSettings, seeds: Sequence[int], out_dir: str | Path,
                  argv: list[str] | None = None,
                  log: Callable[[str], None] = print) -> dict | None:
    """Train ``settings`` once per seed into ``out_dir/seed-N`` (or read back, or resume),
    then summarise into ``out_dir/summary.json``; ranks other than 0 return None."""
    if not seeds:
        raise ValueError("at least one seed is needed")
    out = Path(out_dir)
    checkpoints, errors = [], []
    for seed in seeds:
        run = dataclasses.replace(settings, seed=seed, out_dir=str(out / f"seed-{seed}"))
        results = run_seed(run, argv, log)
        errors.append(results.get("best", results["final"])["error"])
        checkpoints.append(Path(run.out_dir) / "best.pt")
    if env_ranks()[0] != 0:  # each fit has left its process group: the rank is torchrun's
        return None
    summary = summarise(settings, list(seeds), errors, checkpoints)
    write_json(out / "summary.json", summary)
    return summary


def run_seed(run: TrainSettings, argv: list[str] | None = None,
             log: Callable[[str], None] = print) -> dict:
    """One seed's results: read back when complete, resumed from last.pt, or trained afresh."""
    run_dir = Path(run.out_dir)
    check_same_recipe(run_dir, run)
    results_path = run_dir / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else None
    if (results is not None and results.get("complete", True)
            and (results["epochs"] >= run.epochs or results.get("reached_target"))):
        log(f"{run_dir}: complete after {results['epochs']} epochs; not trained again")
        return results
    last = run_dir / "last.pt"
    if last.is_file():
        return fit(resumed_settings(last, run, out_dir=str(run_dir)), resume=str(last),
                   argv=argv, log=log)
    return fit(run, argv=argv, log=log)


def check_same_recipe(run_dir: Path, run: TrainSettings) -> None:
    """A ValueError when ``run_dir`` holds a run of other settings than ``run``."""
    config = run_dir / "config.json"
    if not config.is_file():
        return
    saved = TrainSettings.from_dict(json.loads(config.read_text())["settings"]).to_dict()
    wanted = run.to_dict()
    differ = sorted(k for k in wanted if k not in NOT_THE_RECIPE and saved[k] != wanted[k])
    if differ:
        raise ValueError(f"{run_dir} holds a run with other settings ("
                         + ", ".join(f"{k} {saved[k]!r}, not {wanted[k]!r}" for k in differ)
                         + "); give another --out-dir")


def summarise(settings: TrainSettings, seeds: list[int], errors: list[float],
              checkpoints: list[Path]) -> dict:
    """Mean ± std of the runs' test errors and their ensemble's test error."""
    run_dirs = [Path(c).parent for c in checkpoints]
    if all((d / name).is_file() for d in run_dirs for name in (SCORES_FILE, LABELS_FILE)):
        ensemble = ensemble_from_runs(run_dirs)
        source = "saved test scores"
    else:
        ensemble = ensemble_of_checkpoints(settings, checkpoints)
        source = "checkpoints"
    mean, std = mean_std(errors)
    protocol = ("validation-selected epoch per seed" if settings.val_size != 0
                else "final epoch per seed (no validation split)")
    return {"seeds": seeds, "protocol": protocol, "test_errors": errors,
            "test_error_mean": mean, "test_error_std": std,
            "ensemble_test_error": ensemble["ensemble_test_error"],
            "ensemble_size": ensemble["ensemble_size"], "ensemble_from": source}


def ensemble_of_checkpoints(settings: TrainSettings, checkpoints: list[Path]) -> dict:
    """The ensemble's test error computed by running every checkpoint on the test set."""
    device = pick_device(settings.device)
    models = [model_from_checkpoint(c, map_location=device) for c in checkpoints]
    test = load_test_set(models[0].config, settings.dataset, settings.data_dir, settings.download,
                         skip_bad=settings.skip_bad_images, progress=False).to(device)
    scores = ensemble_scores(models, test.images).cpu().numpy()  # (N, J)
    return {"ensemble_test_error": error_of(scores, test.labels.cpu().numpy()),
            "ensemble_size": len(models)}


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1 in the denominator; 0 for one value)."""
    if not values:
        raise ValueError("no values")
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def ensemble_scores(models: Sequence[nn.Module], images: torch.Tensor,
                    batch_size: int = 500) -> torch.Tensor:
    """Class scores (N, J) averaged over ``models`` (capsule lengths for CapsNets)."""
    return torch.stack([predict_scores(model, images, batch_size) for model in models]).mean(0)


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
