"""The one epoch driver: selection by validation, the target-accuracy stop, and affNIST and
MultiMNIST runs that resume exactly like `capsnet train`."""
from __future__ import annotations

import json

import pytest
import torch

from capsnet.checkpoint import CheckpointError, load_checkpoint
from capsnet.cli.main import main
from capsnet.experiments.affnist import train_affnist
from capsnet.experiments.multimnist import train_multimnist
from capsnet.training.metrics_log import read_metrics
from capsnet.training.runner import Task, run_task
from capsnet.training.settings import TrainSettings

FIXED_KERNELS = {"precision": "fp32"}


class ScriptedTask(Task):
    """A task whose validation accuracies are given: a real model and optimiser step, no data."""

    name = "classify"

    def __init__(self, settings, scores):
        super().__init__(settings)
        self.scores = iter(scores)

    def prepare(self, device):
        pass

    def model_overrides(self):
        return {"image_size": 28, "num_classes": 10}

    def describe(self, world):
        return "scripted"

    def epoch_batches(self, model, epoch, world):
        return torch.arange(2), lambda idx: (torch.rand(len(idx), 1, 28, 28),)

    def batch_loss(self, model, batch, run_fraction):
        return model(batch[0]).scores.square().sum(), torch.zeros((), dtype=torch.long)

    def validate(self, model, world):
        return {"val_accuracy": next(self.scores)}

    def final_report(self, final, best, state, log):
        return {"best_is_separate": best is not None}


def scripted(tmp_path, scores, **settings):
    values = dict(model="cnn", preset="small", epochs=len(scores), lr_decay=0.5,
                  out_dir=str(tmp_path), progress=False, **FIXED_KERNELS)
    return ScriptedTask(TrainSettings(**{**values, **settings}), scores)


def test_the_best_validation_epoch_is_kept(tmp_path):
    results = run_task(scripted(tmp_path, [0.3, 0.6, 0.4]), log=lambda _: None)
    assert (results["epochs"], results["best_epoch"], results["best_val_accuracy"]) == (3, 2, 0.6)
    assert results["reached_target"] is False and results["best_is_separate"] is True
    best = torch.load(tmp_path / "best.pt", weights_only=True)
    assert best["metrics"]["epoch"] == 2 and best["metrics"]["lr"] == pytest.approx(5e-4)
    assert (tmp_path / "metrics.csv").read_text().count("\n") == 4
    assert json.loads((tmp_path / "results.json").read_text())["best_epoch"] == 2


def test_a_target_accuracy_stops_the_run(tmp_path):
    lines = []
    results = run_task(scripted(tmp_path, [0.3, 0.8, 0.9], target_accuracy=0.75), log=lines.append)
    assert results["epochs"] == 2 and results["reached_target"] and results["best_epoch"] == 2
    assert results["best_is_separate"] is False  # the final epoch is the selected one
    assert any("reached the target" in line for line in lines)
    # resuming a run that reached its target trains no further
    again = run_task(scripted(tmp_path, [], target_accuracy=0.75, epochs=3), resume=str(tmp_path),
                     log=lambda _: None)
    assert again["epochs"] == 2


def assert_same_run(resumed_dir, uninterrupted_dir):
    resumed, uninterrupted = (load_checkpoint(d / "last.pt") for d in (resumed_dir,
                                                                        uninterrupted_dir))
    assert resumed["epoch"] == uninterrupted["epoch"]
    for name, tensor in uninterrupted["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], tensor, rtol=0, atol=0,
                                   msg=lambda m, name=name: f"{name}: {m}")
    assert ([r["train_loss"] for r in read_metrics(resumed_dir)]
            == [r["train_loss"] for r in read_metrics(uninterrupted_dir)])


def protocol_settings(tiny_mnist_dir, out_dir, epochs, **extra):
    return TrainSettings(preset="small", data_dir=str(tiny_mnist_dir), download=False,
                         epochs=epochs, subset=60, val_size=40, batch_size=20,
                         out_dir=str(out_dir), progress=False, **FIXED_KERNELS, **extra)


@pytest.mark.parametrize("protocol", ["affnist", "multimnist"])
def test_protocol_runs_resume_bit_exactly(protocol, tiny_mnist_dir, tmp_path):
    train = {"affnist": train_affnist, "multimnist": train_multimnist}[protocol]
    extra = {"affnist": {"test_limit": 20}, "multimnist": {"test_pairs": 20}}[protocol]
    quiet = {"log": lambda _: None}
    full, part = tmp_path / "full", tmp_path / "part"
    train(protocol_settings(tiny_mnist_dir, full, 2, **extra), **quiet)
    train(protocol_settings(tiny_mnist_dir, part, 1, **extra), **quiet)
    results = train(protocol_settings(tiny_mnist_dir, part, 2, **extra), resume=str(part),
                    **quiet)
    assert results["task"] == protocol and results["epochs"] == 2
    assert_same_run(part, full)
    assert load_checkpoint(part / "last.pt")["train_settings"]["task"] == protocol


def test_protocol_cli_resumes_and_refuses_another_task(tiny_mnist_dir, tmp_path, capsys):
    data = ["--data-dir", str(tiny_mnist_dir), "--no-download", "--preset", "small",
            "--subset", "60", "--val-size", "40", "--batch-size", "20", "--no-progress",
            "--precision", "fp32"]
    run = tmp_path / "mm"
    assert main(["multimnist", "train", *data, "--epochs", "1", "--test-pairs", "20",
                 "--out-dir", str(run)]) == 0
    assert main(["multimnist", "train", "--resume", str(run), "--epochs", "2",
                 "--no-progress"]) == 0
    assert load_checkpoint(run / "last.pt")["epoch"] == 2
    assert [int(r["epoch"]) for r in read_metrics(run)] == [1, 2]
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "--epochs", "3", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "a multimnist run" in err and len(err.splitlines()) == 1
    with pytest.raises(CheckpointError, match="a multimnist run"):
        train_affnist(protocol_settings(tiny_mnist_dir, run, 3), resume=str(run),
                      log=lambda _: None)


def test_a_time_limit_stops_before_an_epoch_would_overrun_and_resume_finishes(tmp_path):
    """After epoch 1 (which took some time) a limit of 0 s leaves no room for epoch 2: the run
    stops there, checkpointed and marked incomplete, untested; --resume finishes it."""
    lines = []
    results = run_task(scripted(tmp_path, [0.3, 0.6, 0.4], time_limit=0.0), log=lines.append)
    assert results["complete"] is False and results["epochs"] == 1 and "final" not in results
    assert any("time limit" in line and "--resume" in line for line in lines)
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 1
    assert json.loads((tmp_path / "results.json").read_text())["complete"] is False
    done = run_task(scripted(tmp_path, [0.6, 0.4], epochs=3), resume=str(tmp_path),
                    log=lambda _: None)
    assert done["complete"] is True and done["epochs"] == 3 and done["best_epoch"] == 2


def test_keep_every_keeps_those_epochs_checkpoints_and_can_be_turned_on_when_resuming(tmp_path):
    """--keep-every 2 over 5 epochs keeps epochs 2 and 4 beside last.pt and best.pt, each the
    state of its own epoch (to compare models at a matched validation accuracy later)."""
    run_task(scripted(tmp_path, [0.3, 0.6, 0.4], keep_every=2), log=lambda _: None)
    assert sorted(p.name for p in tmp_path.glob("epoch-*.pt")) == ["epoch-002.pt"]
    kept = load_checkpoint(tmp_path / "epoch-002.pt")
    assert kept["epoch"] == 2 and kept["metrics"]["val_accuracy"] == 0.6
    run_task(scripted(tmp_path, [0.5, 0.7], epochs=5, keep_every=1), resume=str(tmp_path),
             log=lambda _: None)
    assert sorted(p.name for p in tmp_path.glob("epoch-*.pt")) == [
        "epoch-002.pt", "epoch-004.pt", "epoch-005.pt"]
    assert load_checkpoint(tmp_path / "epoch-005.pt")["metrics"]["val_accuracy"] == 0.7


def test_keep_every_must_be_positive():
    with pytest.raises(ValueError, match="keep_every"):
        TrainSettings(keep_every=0)


def test_a_run_checkpointed_every_two_epochs_resumes_from_the_last_one_exactly(
        tiny_mnist_dir, tmp_path, monkeypatch):
    """--checkpoint-every 2 over 4 epochs, interrupted in epoch 4: last.pt holds epoch 2, the
    resume drops epoch 3's row and redoes it, and the run ends as an uninterrupted one."""
    from capsnet.training import fit, runner

    full, part = tmp_path / "full", tmp_path / "part"
    fit(protocol_settings(tiny_mnist_dir, full, 4, checkpoint_every=2), log=lambda _: None)
    real, epochs = runner.run_epoch, []

    def interrupted_in_epoch_4(*args, **kwargs):
        epochs.append(1)
        if len(epochs) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "run_epoch", interrupted_in_epoch_4)
    with pytest.raises(KeyboardInterrupt):
        fit(protocol_settings(tiny_mnist_dir, part, 4, checkpoint_every=2), log=lambda _: None)
    assert load_checkpoint(part / "last.pt")["epoch"] == 2
    assert [r["epoch"] for r in read_metrics(part)] == [1, 2, 3]
    monkeypatch.setattr(runner, "run_epoch", real)
    fit(protocol_settings(tiny_mnist_dir, part, 4, checkpoint_every=2), resume=str(part),
        log=lambda _: None)
    assert [r["epoch"] for r in read_metrics(part)] == [1, 2, 3, 4]
    assert_same_run(part, full)
