"""The training-memory estimate against measured peaks (live CPU tensors, as
benchmarks/memory_check.py counts them), the largest batch that fits, and a GPU running
out of memory as one line that leaves the earlier checkpoints good."""
from __future__ import annotations

import importlib
import json

import pytest
import torch

from benchmarks.memory_check import measured_peak
from capsnet.checkpoint import load_checkpoint
from capsnet.cli.main import main
from capsnet.models import make_config
from capsnet.tuning.memory import (
    GIB,
    MemoryEstimate,
    estimate_training_memory,
    largest_batch,
    out_of_memory_message,
    usable_gpu_bytes,
)
from tests.conftest import last_error_line

fit_module = importlib.import_module("capsnet.training.fit")  # the module, not the function
TOLERANCE = 0.25
LAYERS = {"capsnet": ("conv1", "primary_caps.conv"),
          "cnn": ("features.0", "features.2", "features.4")}


def check(model: str, preset: str, batch: int, precision: str, impl: str, **overrides):
    config = make_config(model, preset, **overrides)
    estimate = estimate_training_memory(config, batch, precision,
                                        dict.fromkeys(LAYERS[model], impl)).total
    measured = measured_peak(config, batch, precision, impl)
    assert abs(estimate / measured - 1) <= TOLERANCE, (estimate / 2**20, measured / 2**20)


@pytest.mark.parametrize("model", ["capsnet", "cnn"])
@pytest.mark.parametrize("precision, impl", [("fp32", "gemm"), ("bf16", "gemm"),
                                             ("fp32", "native"), ("bf16", "channels_last")])
@pytest.mark.parametrize("batch", [4, 48])
def test_the_estimate_is_within_25_percent_of_the_measured_peak(model, precision, impl, batch):
    check(model, "small", batch, precision, impl)


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [{}, {"image_size": 32, "in_channels": 3}])
@pytest.mark.parametrize("precision, impl", [("fp32", "gemm"), ("bf16", "gemm"),
                                             ("bf16", "native")])
def test_the_paper_models_estimate_is_within_25_percent(overrides, precision, impl):
    check("capsnet", "paper", 32, precision, impl, **overrides)


def test_the_estimate_grows_with_the_batch_and_names_its_parts():
    config = make_config("capsnet", "paper")
    small, large = (estimate_training_memory(config, b, "bf16", device_type="cuda")
                    for b in (16, 512))
    assert large.total > small.total and large.model_state == small.model_state
    assert small.model_state == 16 * 8_215_568  # weights, gradients, Adam's two moments
    assert "GiB at batch 512" in large.describe() and "estimate" in large.describe()
    on_gpu = estimate_training_memory(config, 128, "fp32", device_type="cuda", resident=2**30)
    assert on_gpu.total - estimate_training_memory(config, 128, "fp32",
                                                   device_type="cuda").total == 2**30


def test_the_largest_batch_that_fits():
    config = make_config("capsnet", "paper")
    capacity = usable_gpu_bytes(16 * GIB)  # a V100-16GB
    fits = largest_batch(config, capacity, "fp16")
    assert fits > 128
    assert estimate_training_memory(config, fits, "fp16", device_type="cuda").total <= capacity
    assert estimate_training_memory(config, fits + 1, "fp16",
                                    device_type="cuda").total > capacity
    assert largest_batch(config, 1000) == 0  # not even the weights fit in 1000 bytes


def test_the_out_of_memory_line_names_the_estimate_and_a_batch_that_fits():
    estimate = MemoryEstimate(batch_size=4096, model_state=GIB, per_image={"all": 2**20})
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
            "--precision", "fp32", "--conv-impl", "gemm"]
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
                 "--epochs", "1", "--no-progress", "--precision", "fp32", "--conv-impl", "gemm",
                 "--out-dir", str(run)]) == 0
    out = capsys.readouterr().out
    assert "speed: precision fp32" in out and "memory: about" in out
    assert json.loads((run / "config.json").read_text())["memory_estimate_bytes"] > 0
