"""The command line end to end, in-process through ``main([...])``, on the tiny fake MNIST."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from capsnet.checkpoint import load_checkpoint, model_from_checkpoint
from capsnet.cli.main import main
from capsnet.config import ConfigError
from capsnet.models import make_config
from capsnet.training import loop

VAL_SIZE = 100
TRAIN_SUBSET, BATCH = 200, 50  # 4 steps per epoch: seconds on a CPU
TEST_IMAGES = 200  # in the conftest's tiny_mnist_dir
METRICS_COLUMNS = ["epoch", "lr", "train_loss", "train_accuracy", "epoch_seconds",
                   "images_per_second", "val_loss", "val_accuracy"]


def train_command(data_dir: Path, out_dir: Path, *extra: str) -> list[str]:
    return ["train", "--preset", "small", "--no-download", "--data-dir", str(data_dir),
            "--val-size", str(VAL_SIZE), "--subset", str(TRAIN_SUBSET), "--batch-size", str(BATCH),
            "--no-progress", "--out-dir", str(out_dir), *extra]


def read_metrics(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def error_line(capsys) -> str:
    """The one line a failed command prints to stderr."""
    err = capsys.readouterr().err.strip()
    assert err.startswith("capsnet: error: ")
    assert "\n" not in err and "Traceback" not in err
    return err


@pytest.fixture(autouse=True)
def _work_in_tmp(tmp_path, monkeypatch):
    """Run every command from a scratch directory so that defaults never write into the repo."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def full_run(tiny_mnist_dir, tmp_path_factory) -> Path:
    """An uninterrupted two-epoch run of the small CapsNet."""
    out = tmp_path_factory.mktemp("cli") / "full"
    assert main(train_command(tiny_mnist_dir, out, "--epochs", "2")) == 0
    return out


def test_train_writes_a_self_describing_run_directory(full_run):
    for name in ["config.json", "command.txt", "metrics.csv", "last.pt", "best.pt", "results.json"]:
        assert (full_run / name).is_file(), name
    config = json.loads((full_run / "config.json").read_text())
    assert config["settings"]["epochs"] == 2 and config["settings"]["preset"] == "small"
    assert config["model_config"]["conv1_channels"] == 32
    command = (full_run / "command.txt").read_text().splitlines()
    assert len(command) == 1 and command[0].startswith("capsnet train --preset small")
    assert "--epochs 2" in command[0]

    rows = read_metrics(full_run)
    assert list(rows[0]) == METRICS_COLUMNS
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    assert float(rows[1]["lr"]) == pytest.approx(float(rows[0]["lr"]) * 0.96)
    for row in rows:
        assert 0 <= float(row["val_accuracy"]) <= 1 and float(row["train_loss"]) > 0

    results = json.loads((full_run / "results.json").read_text())
    assert results["epochs"] == 2
    best_epoch = results["best_epoch"]
    assert best_epoch in (1, 2)
    best_val = max(float(r["val_accuracy"]) for r in rows)
    assert results["best_val_accuracy"] == pytest.approx(best_val)
    for key in ["final", "best"]:
        assert set(results[key]) >= {"accuracy", "error", "loss", "per_class_accuracy", "confusion"}
        assert sum(map(sum, results[key]["confusion"])) == TEST_IMAGES

    last, best = load_checkpoint(full_run / "last.pt"), load_checkpoint(full_run / "best.pt")
    assert last["epoch"] == 2 and best["epoch"] == best_epoch
    assert {"optimizer", "scheduler", "rng", "train_settings"} <= set(last)
    assert type(model_from_checkpoint(full_run / "best.pt")).__name__ == "CapsNet"


# the CNN's dropout needs the saved RNG
@pytest.mark.parametrize("model", [pytest.param("capsnet", marks=pytest.mark.slow), "cnn"])
def test_resume_matches_an_uninterrupted_run(model, tiny_mnist_dir, tmp_path):
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(train_command(tiny_mnist_dir, full, "--model", model, "--epochs", "2")) == 0
    assert main(train_command(tiny_mnist_dir, part, "--model", model, "--epochs", "1")) == 0
    assert load_checkpoint(part / "last.pt")["epoch"] == 1
    assert main(["train", "--resume", str(part), "--epochs", "2", "--no-progress"]) == 0

    resumed, uninterrupted = load_checkpoint(part / "last.pt"), load_checkpoint(full / "last.pt")
    assert resumed["epoch"] == 2 and resumed["model"] == model
    assert resumed["state_dict"].keys() == uninterrupted["state_dict"].keys()
    for name, tensor in uninterrupted["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], tensor, rtol=0, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")
    for i, state in uninterrupted["optimizer"]["state"].items():
        for name in ["exp_avg", "exp_avg_sq"]:
            torch.testing.assert_close(resumed["optimizer"]["state"][i][name], state[name],
                                       rtol=0, atol=1e-6)
    assert resumed["scheduler"] == uninterrupted["scheduler"]
    assert ([r["train_loss"] for r in read_metrics(part)] ==
            [r["train_loss"] for r in read_metrics(full)])
    assert len((part / "command.txt").read_text().splitlines()) == 2


def test_resume_continues_in_the_resumed_run_directory(tiny_mnist_dir, tmp_path, monkeypatch):
    """A run started with a relative --out-dir, resumed from elsewhere, stays in its directory."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    first = train_command(tiny_mnist_dir, Path("runs/x"), "--epochs", "1", "--subset", "100")
    assert main(first) == 0
    run_dir = tmp_path / "a" / "runs" / "x"
    monkeypatch.chdir(tmp_path / "b")
    assert main(["train", "--resume", str(run_dir), "--epochs", "2", "--no-progress"]) == 0
    assert load_checkpoint(run_dir / "last.pt")["epoch"] == 2
    assert [int(r["epoch"]) for r in read_metrics(run_dir)] == [1, 2]
    assert not (tmp_path / "b" / "runs").exists()


def test_resume_may_anneal_at_a_new_rate(tiny_mnist_dir, tmp_path):
    """--lr-decay given with --resume applies from the next epoch on; the other saved settings
    (here the batch size) stay the run's own, and a later plain resume keeps the new decay."""
    run_dir = tmp_path / "run"
    assert main(train_command(tiny_mnist_dir, run_dir, "--epochs", "2", "--subset", "100")) == 0
    assert main(["train", "--resume", str(run_dir), "--epochs", "4", "--lr-decay", "0.5",
                 "--batch-size", "10", "--no-progress"]) == 0
    assert main(["train", "--resume", str(run_dir), "--epochs", "5", "--no-progress"]) == 0
    lrs = [float(r["lr"]) for r in read_metrics(run_dir)]
    assert lrs == pytest.approx([1e-3, 0.96e-3, 0.96 ** 2 * 1e-3, 0.96 ** 2 * 0.5e-3,
                                 0.96 ** 2 * 0.25e-3])
    settings = load_checkpoint(run_dir / "last.pt")["train_settings"]
    assert settings["lr_decay"] == 0.5 and settings["batch_size"] == BATCH
    assert json.loads((run_dir / "config.json").read_text())["settings"]["lr_decay"] == 0.5


def test_evaluate_json(full_run, tiny_mnist_dir, capsys):
    capsys.readouterr()
    code = main(["evaluate", str(full_run / "best.pt"), "--no-download",
                 "--data-dir", str(tiny_mnist_dir), "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == TEST_IMAGES and report["precision"] in ("fp32", "bf16")
    assert 0 <= report["accuracy"] <= 1
    assert report["error"] == pytest.approx(1 - report["accuracy"])
    confusion = torch.tensor(report["confusion"])
    assert confusion.shape == (10, 10) and confusion.sum() == TEST_IMAGES
    assert report["accuracy"] == pytest.approx(confusion.diag().sum().item() / TEST_IMAGES)
    per_class = confusion.diag().double() / confusion.sum(1).clamp_min(1)
    assert report["per_class_accuracy"] == pytest.approx(per_class.tolist())
    results = json.loads((full_run / "results.json").read_text())
    assert report["accuracy"] == pytest.approx(results["best"]["accuracy"])


def test_evaluate_text_report(full_run, tiny_mnist_dir, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(full_run / "last.pt"), "--no-download",
                 "--data-dir", str(tiny_mnist_dir), "--precision", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "accuracy" in out and "per-class accuracy" in out and "confusion matrix" in out
    assert "images, precision fp32: --precision to choose)" in out  # says what it chose


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_missing_data_is_a_one_line_error_naming_the_files(command, full_run, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    args = (train_command(empty, tmp_path / "run", "--epochs", "1") if command == "train" else
            ["evaluate", str(full_run / "best.pt"), "--no-download", "--data-dir", str(empty)])
    capsys.readouterr()
    assert main(args) == 1
    err = error_line(capsys)
    assert "train-images-idx3-ubyte" in err and "t10k-labels-idx1-ubyte" in err
    assert str(empty) in err and "download disabled" in err


@pytest.mark.parametrize("options, match", [
    (["--model", "efficient", "--routing", "inverted-attention"],
     "--routing is not an option of --model efficient (only of --model capsnet, capshead)"),
    (["--routing", "self-attention", "--routing-iterations", "2"],
     "self-attention routing takes no routing_iterations; it is an option of dynamic, "),
    (["--model", "efficient", "--input-norm", "image"],
     "--input-norm is not an option of --model efficient (only of --model capsnet"),
    (["--model", "cnn", "--cnn-head", "capsules", "--cnn-decoder", "plain"],
     "the CNN's capsule head takes no decoder (given: 'plain')"),
    (["--model", "capsnet", "--cnn-head", "capsules"],
     "--cnn-head is not an option of --model capsnet (only of --model cnn)"),
    (["--model", "capsnet", "--cnn-decoder", "plain"],
     "--cnn-decoder is not an option of --model capsnet (only of --model cnn)"),
    (["--model", "em", "--preset", "half"], "unknown preset 'half' for em; choose from paper"),
])
def test_a_model_option_the_model_cannot_honour_is_a_usage_error_before_any_training(
        options, match, tmp_path, capsys):
    """Exit status 2 (as argparse's own errors), one line, no run directory; the options
    the user did not give (every model's defaults) never trip the check."""
    run = tmp_path / "run"
    assert main(["train", *options, "--data-dir", str(tmp_path / "none"), "--no-download",
                 "--out-dir", str(run)]) == 2
    assert match in error_line(capsys) and not run.exists()


def test_python_callers_see_the_config_key_that_the_cli_names_by_its_flag():
    """`--cnn-decoder` sets the CNN's config option `decoder`: make_config names the key."""
    with pytest.raises(ConfigError, match="unknown option 'decoder' for capsnet; choose from "):
        make_config("capsnet", decoder="plain")


def test_bad_checkpoint_is_a_one_line_error(tiny_mnist_dir, tmp_path, capsys):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    assert main(["evaluate", str(bad), "--no-download", "--data-dir", str(tiny_mnist_dir)]) == 1
    assert "bad.pt" in error_line(capsys)


def test_nan_loss_stops_with_a_clear_message_and_keeps_the_last_checkpoint(
        tiny_mnist_dir, tmp_path, monkeypatch, capsys):
    steps_per_epoch = 2  # --subset 200 --batch-size 100
    training_steps = []
    real_loss = loop.model_loss

    def loss_turning_nan_in_epoch_2(output, images, labels, weight, **kwargs):
        loss = real_loss(output, images, labels, weight, **kwargs)
        if torch.is_grad_enabled():  # a training step, not evaluation
            training_steps.append(1)
            if len(training_steps) > steps_per_epoch:
                return loss * float("nan")
        return loss

    monkeypatch.setattr(loop, "model_loss", loss_turning_nan_in_epoch_2)
    run = tmp_path / "nan-run"
    capsys.readouterr()
    code = main(train_command(tiny_mnist_dir, run, "--epochs", "3", "--subset", "200",
                              "--batch-size", "100"))
    assert code == 1
    err = error_line(capsys)
    assert "training loss became nan" in err and "last.pt" in err and "(epoch 1)" in err
    # stopped at epoch 2's first read-back, after its first step
    assert len(training_steps) == steps_per_epoch + 1
    payload = load_checkpoint(run / "last.pt")
    assert payload["epoch"] == 1
    assert all(torch.isfinite(t).all() for t in payload["state_dict"].values())
    model_from_checkpoint(run / "last.pt")
    assert [int(r["epoch"]) for r in read_metrics(run)] == [1]
    assert not (run / "results.json").exists()


def test_version_and_usage(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.startswith("capsnet ")
    with pytest.raises(SystemExit) as info:
        main(["train", "--model", "transformer"])
    assert info.value.code == 2


@pytest.mark.parametrize("words, lr", [
    (["train"], 1e-3),  # the paper's
    (["train", "--model", "cnn"], 1e-4),  # the wide CNN baseline dies at 1e-3
    (["train", "--model", "cnn", "--preset", "small"], 1e-3),
    (["affnist", "train", "--model", "cnn", "--preset", "half"], 1e-4),
    (["train", "--model", "cnn", "--lr", "5e-4"], 5e-4),  # given: obeyed
])
def test_the_learning_rate_default_follows_the_model(words, lr):
    from capsnet.cli.args import settings_from_args
    from capsnet.cli.main import build_parser

    args = build_parser().parse_args(words)
    assert settings_from_args(args).lr == lr


def test_library_settings_take_the_same_learning_rate_default():
    from capsnet.training.settings import TrainSettings

    assert TrainSettings().lr == 1e-3
    assert TrainSettings(model="cnn").lr == 1e-4
    assert TrainSettings(model="cnn", preset="small").lr == 1e-3
    stored = TrainSettings(model="cnn", lr=3e-4).to_dict()
    assert TrainSettings.from_dict(stored).lr == 3e-4  # a run's own rate survives a resume


@pytest.mark.parametrize("text, stride", [("auto", "auto"), ("2", 2), ("0", None), ("x", None),
                                          ("-1", None), ("1.5", None)])
def test_conv1_stride_takes_auto_or_a_whole_number_from_one(text, stride, capsys):
    from capsnet.cli.main import build_parser

    if stride is None:
        with pytest.raises(SystemExit):
            build_parser().parse_args(["train", "--conv1-stride", text])
        assert "expected 'auto' or a whole number >= 1" in capsys.readouterr().err
    else:
        assert build_parser().parse_args(["train", "--conv1-stride", text]).conv1_stride == stride
