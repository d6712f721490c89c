"""The training-memory figure (one step measured at two small batches, extrapolated)
against whole training steps measured at the full batch (live CPU tensors, as
benchmarks/memory_check.py counts them), the largest batch that fits, and a GPU running
out of memory as one line that leaves the earlier checkpoints good."""
from __future__ import annotations

import importlib
import json

import pytest
import torch

from benchmarks.memory_check import estimated_peak, measured_peak
from capsnet.checkpoint import load_checkpoint
from capsnet.cli.main import main
from capsnet.models import build_model, make_config
from capsnet.tuning import (
    GIB,
    PROBE_BATCHES,
    MemoryEstimate,
    measure_training_memory,
    out_of_memory_message,
    usable_gpu_bytes,
)
from tests.conftest import last_error_line

fit_module = importlib.import_module("capsnet.training.fit")  # the module, not the function
TOLERANCE = 0.05


@pytest.mark.parametrize("model, preset", [("capsnet", "small"), ("cnn", "small")])
@pytest.mark.parametrize("precision, impl", [("fp32", "gemm"), ("bf16", "gemm"),
                                             ("fp32", "native")])
def test_the_estimate_is_within_5_percent_of_whole_steps_at_the_full_batch(
        model, preset, precision, impl):
    config = make_config(model, preset)
    batch = 48
    estimate, measured = (f(config, batch, precision, impl) for f in (estimated_peak,
                                                                       measured_peak))
    assert abs(estimate / measured - 1) <= TOLERANCE, (estimate / 2**20, measured / 2**20)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_paper_models_estimate_is_within_5_percent(precision):
    config = make_config("capsnet", "paper", image_size=32, in_channels=3)
    estimate, measured = (f(config, 32, precision) for f in (estimated_peak, measured_peak))
    assert abs(estimate / measured - 1) <= TOLERANCE, (estimate / 2**20, measured / 2**20)


def test_measuring_leaves_the_model_its_gradients_and_the_random_state_alone():
    model = build_model(make_config("efficient", "small"))  # BatchNorm statistics, too
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    estimate = measure_training_memory(model, 128, resident=2**30)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert estimate.weights_and_adam == 3 * weights  # weights and Adam's two moments
    assert estimate.per_image > 0 and estimate.fixed >= estimate.weights_and_adam
    assert estimate.total == 2**30 + estimate.fixed + 128 * estimate.per_image
    line = estimate.describe()
    assert "GiB at batch 128" in line and f"batches {PROBE_BATCHES[0]} and" in line


def test_the_largest_batch_that_fits():
    estimate = MemoryEstimate(batch_size=4096, phases=((GIB, 2**20),))
    capacity = usable_gpu_bytes(16 * GIB)  # a V100-16GB
    fits = estimate.largest_batch(capacity)
    assert GIB + fits * 2**20 <= capacity < GIB + (fits + 1) * 2**20
    assert estimate.largest_batch(GIB) == 0  # the weights alone fill it
    # two phases: the steeper one bounds a large batch, the one peaking at 4096 the total
    steep = MemoryEstimate(batch_size=4096, phases=((2 * GIB, 2**20), (GIB, 2**21)))
    assert steep.total == GIB + 4096 * 2**21 and steep.per_image == 2**21
    assert steep.largest_batch(4 * GIB) == 1536  # 3 GiB / 2 MiB, not 2 GiB / 1 MiB


def test_the_out_of_memory_line_names_the_estimate_and_a_batch_that_fits():
    estimate = MemoryEstimate(batch_size=4096, phases=((GIB, 2**20),))
    line = out_of_memory_message("cuda:0", estimate, 16 * GIB, 900)
    assert "\n" not in line and "batch 4096" in line and "5.00 GiB" in line
    assert "16.0 GiB" in line and "--batch-size 900" in line and "intact" in line
    assert "not even one image" in out_of_memory_message("cuda", estimate, 16 * GIB, 0)


def test_a_gpu_out_of_memory_is_one_line_and_the_checkpoints_stay_good(
        tiny_mnist_dir, tmp_path, monkeypatch, capsys):
    """CUDA runs out of memory in epoch 2: the command ends with one line naming the
    estimate, and last.pt from epoch 1 loads and resumes."""
    real = fit_module.train_one_epoch
    epochs = []

    def running_out_in_epoch_2(*args, **kwargs):
        epochs.append(1)
        if len(epochs) == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(fit_module, "train_one_epoch", running_out_in_epoch_2)
    run = tmp_path / "oom"
    data = ["--preset", "small", "--data-dir", str(tiny_mnist_dir), "--no-download",
            "--subset", "60", "--val-size", "40", "--batch-size", "20", "--no-progress",
            "--precision", "fp32"]
    assert main(["train", *data, "--epochs", "3", "--out-dir", str(run)]) == 1
    line = last_error_line(capsys)
    assert "ran out of memory at batch 20" in line and "estimate" in line
    assert load_checkpoint(run / "last.pt")["epoch"] == 1
    monkeypatch.setattr(fit_module, "train_one_epoch", real)
    assert main(["train", "--resume", str(run), "--epochs", "2", "--no-progress"]) == 0
    assert load_checkpoint(run / "last.pt")["epoch"] == 2


def test_train_logs_the_estimate_with_the_plan(tiny_mnist_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--preset", "small", "--data-dir", str(tiny_mnist_dir),
                 "--no-download", "--subset", "40", "--val-size", "20", "--batch-size", "20",
                 "--epochs", "1", "--no-progress", "--precision", "fp32",
                 "--out-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "speed: precision fp32; convolutions: conv1 gemm" in out and "memory: about" in out
    assert json.loads((run / "config.json").read_text())["memory_estimate_bytes"] > 0
