"""The training-memory figure, read once after the run's first step (no probe of its own):
what it says, the largest batch that fits, and a GPU running out of memory as one line that
leaves the earlier checkpoints good."""
from __future__ import annotations

import importlib
import json

import pytest
import torch

from capsnet.checkpoint import load_checkpoint
from capsnet.cli.main import main
from capsnet.losses import model_loss
from capsnet.models import build_model, make_config
from capsnet.models.sizing import LiveBytes, peak_estimate, traced_peak_bytes, untraced
from capsnet.tuning import (
    GIB,
    largest_batch,
    measure_step_memory,
    memory_line,
    out_of_memory_message,
    resident_bytes,
    usable_gpu_bytes,
)
from tests.conftest import last_error_line

runner = importlib.import_module("capsnet.training.runner")  # the module, not a function
MIB = 2**20
STEP_BATCH, EVAL_IMAGES = 16, 64
TRACE_TOLERANCE = 0.1


def tiny_train(tiny_mnist_dir, run, epochs: int) -> list[str]:
    return ["train", "--preset", "small", "--data-dir", str(tiny_mnist_dir), "--no-download",
            "--subset", "60", "--val-size", "40", "--batch-size", "20", "--no-progress",
            "--precision", "fp32", "--epochs", str(epochs), "--out-dir", str(run)]


@pytest.mark.skipif(resident_bytes() is None, reason="the system does not say")
def test_on_a_cpu_the_figure_is_the_processes_peak_resident_memory():
    held, peak = resident_bytes()
    assert peak >= held > 0
    memory = measure_step_memory(torch.device("cpu"), 128)
    assert memory["step_peak"] >= peak and memory["batch"] == 128
    line = memory_line(memory, 1)
    assert "GiB peak per process by the end of epoch 1" in line and "batch 128" in line


def test_the_largest_batch_that_fits():
    memory = {"step_peak": 5 * GIB, "held": GIB, "batch": 4096, "device": "cuda"}  # 1 MiB/image
    capacity = usable_gpu_bytes(16 * GIB)  # a V100-16GB
    fits = largest_batch(memory, capacity)
    assert GIB + fits * MIB <= capacity < GIB + (fits + 1) * MIB
    assert largest_batch(memory, GIB) == 0  # what stays between steps fills it


def test_the_out_of_memory_line_names_the_measure_and_what_to_do(monkeypatch):
    monkeypatch.setattr("capsnet.tuning.device_memory", lambda device: 16 * GIB)
    memory = {"step_peak": 5 * GIB, "held": GIB, "batch": 4096, "device": "cuda"}
    line = out_of_memory_message(torch.device("cuda", 0), 4096, memory)
    fits = largest_batch(memory, usable_gpu_bytes(16 * GIB))
    assert "\n" not in line and "batch 4096" in line and "5.00 GiB" in line
    assert "16.0 GiB" in line and f"--batch-size {fits}" in line and "intact" in line
    before = out_of_memory_message(torch.device("cuda", 0), 4096, {})
    assert "\n" not in before and "before the first training step" in before


def test_a_gpu_out_of_memory_is_one_line_and_the_checkpoints_stay_good(
        tiny_mnist_dir, tmp_path, monkeypatch, capsys):
    """CUDA runs out of memory in epoch 2: the command ends with one line naming the
    measured figure, and last.pt from epoch 1 loads and resumes."""
    real = runner.run_epoch
    epochs = []

    def running_out_in_epoch_2(*args, **kwargs):
        epochs.append(1)
        if len(epochs) == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(runner, "run_epoch", running_out_in_epoch_2)
    run = tmp_path / "oom"
    assert main(tiny_train(tiny_mnist_dir, run, 3)) == 1
    line = last_error_line(capsys)
    assert "ran out of memory at batch 20" in line and "the first step measured" in line
    assert load_checkpoint(run / "last.pt")["epoch"] == 1
    monkeypatch.setattr(runner, "run_epoch", real)
    assert main(["train", "--resume", str(run), "--epochs", "2", "--no-progress"]) == 0
    assert load_checkpoint(run / "last.pt")["epoch"] == 2


def test_train_logs_the_measure_with_the_plan(tiny_mnist_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(tiny_train(tiny_mnist_dir, run, 1)) == 0
    out = capsys.readouterr().out
    assert "speed: precision fp32; convolutions: conv1 gemm" in out
    assert "memory: " in out and "peak per process by the end of epoch 1" in out
    results = json.loads((run / "results.json").read_text())
    assert (resident_bytes() is None) or results["memory_peak_bytes"] > 0
    estimate = out.index("memory: about")  # printed before the first epoch
    assert estimate < out.index("epoch 1 |") and "traced on fake tensors" in out
    assert "without the heap's fragments" in out  # a CPU's: what the trace cannot see
    if resident_bytes() is not None:
        assert 0 < results["memory_tensors_bytes"] <= results["memory_estimate_bytes"]


def test_the_trace_on_fake_tensors_counts_what_real_tensors_take():
    """The estimate's trace (shapes only) against the same step and evaluation batch run on
    real tensors, counted by the same live-tensor counter: within TRACE_TOLERANCE."""
    torch.manual_seed(0)
    model = build_model(make_config("capsnet", "small"))
    traced = traced_peak_bytes(model, STEP_BATCH, EVAL_IMAGES)
    optimizer = torch.optim.Adam(model.parameters())
    x = torch.rand(STEP_BATCH, 1, 28, 28)
    y = torch.arange(STEP_BATCH) % 10
    model_loss(model(x, y), x, y).backward()
    optimizer.step()  # Adam's moments exist, as at a run's second step
    optimizer.zero_grad(set_to_none=True)
    with LiveBytes() as live:
        model_loss(model(x, y), x, y).backward()
        optimizer.step()
        training, held = live.peak, live.current
        live.reset()
        with torch.no_grad():
            model.eval()(torch.rand(EVAL_IMAGES, 1, 28, 28))
    # the trace makes Adam's moments inside it; the real step made them before the counter
    moments = 2 * sum(p.numel() * p.element_size() for p in model.parameters())
    measured = (training + moments, live.peak - held)
    for counted, real in zip(traced, measured, strict=True):
        assert abs(counted - real) <= TRACE_TOLERANCE * real, (traced, measured)


def test_a_cpu_estimate_adds_the_phases_and_names_the_part_its_tensors_take():
    """On a CPU the phases add (the heap's fragments, untraced, take the rest) and the line
    says so; on a GPU the allocated bytes peak at the larger phase and the line adds nothing."""
    torch.manual_seed(0)
    model = build_model(make_config("capsnet", "small"))
    now = GIB
    training, evaluation = traced_peak_bytes(model, STEP_BATCH, EVAL_IMAGES)
    estimate, tensors = peak_estimate(model, STEP_BATCH, EVAL_IMAGES, (now, now))
    assert (estimate, tensors) == (now + training + evaluation, now + max(training, evaluation))
    line = untraced(torch.device("cpu"), estimate, tensors)
    assert f"; {tensors / GIB:.2f} GiB of it without the heap's fragments" in line
    assert f"the {(estimate - tensors) / GIB:.2f} GiB allowed" in line
    assert untraced(torch.device("cuda"), tensors, tensors) == ""
