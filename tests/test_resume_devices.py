"""Checkpoints between devices and machines: one written on a GPU (its tensors tagged
cuda:0, its RNG state holding CUDA generators) loads and resumes on a CPU; a resume reads the
checkpoint on the CPU; the CUDA RNG state goes to each rank's own GPU or nowhere; fp16's
gradient scaler trains, is saved and resumed; --keep-every keeps weights only."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.serialization

from capsnet.checkpoint import CheckpointError, load_checkpoint, load_model
from capsnet.cli.main import main
from capsnet.experiments.matching import kept_checkpoints
from capsnet.models import build_model, make_config
from capsnet.training import TrainSettings, fit
from capsnet.training import runner as runner_module
from capsnet.training.distributed import cuda_rng_state_for, rng_state, set_rng_state
from capsnet.training.loop import train_step
from capsnet.training.settings import resumed_settings


def settings(data_dir, out_dir, epochs, **extra) -> TrainSettings:
    values = dict(preset="small", data_dir=str(data_dir), download=False, epochs=epochs,
                  subset=60, val_size=40, batch_size=20, out_dir=str(out_dir), progress=False,
                  precision="fp32")
    return TrainSettings(**{**values, **extra})


@contextlib.contextmanager
def saved_as_on_a_gpu():
    """torch.save tags every tensor as cuda:0, as a checkpoint written by a GPU run is: such
    a file loads on a CPU-only machine only with a map_location."""
    original = torch.serialization.location_tag
    torch.serialization.location_tag = lambda storage: "cuda:0"
    try:
        yield
    finally:
        torch.serialization.location_tag = original


def gpu_checkpoint(path):
    """Rewrite a checkpoint as a 2-GPU DDP run would have: tensors tagged cuda:0 and the CUDA
    generators of ranks 0 and 1 in its RNG state."""
    payload = torch.load(path, weights_only=True)
    payload["rng"]["cuda_by_rank"] = [torch.zeros(16, dtype=torch.uint8),
                                      torch.ones(16, dtype=torch.uint8)]
    with saved_as_on_a_gpu():
        torch.save(payload, path)


def test_a_checkpoint_written_on_a_gpu_loads_and_resumes_on_a_cpu(tiny_mnist_dir, tmp_path):
    run = tmp_path / "run"
    fit(settings(tiny_mnist_dir, run, 1), log=lambda _: None)
    gpu_checkpoint(run / "last.pt")
    with pytest.raises(RuntimeError, match="CUDA"):  # what a plain torch.load would do
        torch.load(run / "last.pt", weights_only=True)
    assert load_checkpoint(run / "last.pt")["epoch"] == 1
    assert load_model(str(run / "last.pt")).config.primary_types == 8
    assert resumed_settings(run, settings(tiny_mnist_dir, run, 2)).epochs == 2
    assert kept_checkpoints(run)[0].epoch == 1
    results = fit(resumed_settings(run, settings(tiny_mnist_dir, run, 2)), resume=str(run),
                  log=lambda _: None)
    assert results["epochs"] == 2 and results["complete"]
    assert main(["export", str(run / "last.pt"), "--format", "safetensors", "-o",
                 str(tmp_path / "w.safetensors")]) == 0


def test_a_resume_reads_the_checkpoint_on_the_cpu(tiny_mnist_dir, tmp_path, monkeypatch):
    """Whatever the device: the state dicts move the weights and Adam's moments to the
    parameters' device, and Adam's step counts stay on the CPU (no host sync per step)."""
    run = tmp_path / "run"
    fit(settings(tiny_mnist_dir, run, 1), log=lambda _: None)
    asked = []
    real = runner_module.load_checkpoint
    monkeypatch.setattr(runner_module, "load_checkpoint",
                        lambda path, map_location="cpu", **kw: asked.append(map_location)
                        or real(path, map_location, **kw))
    seen = {}
    real_restore = runner_module._restore

    def spy(path, task, training, world):
        result = real_restore(path, task, training, world)
        seen["steps"] = {s["step"].device.type for s in training.optimizer.state.values()}
        return result

    monkeypatch.setattr(runner_module, "_restore", spy)
    fit(settings(tiny_mnist_dir, run, 2), resume=str(run), log=lambda _: None)
    assert asked == ["cpu"] and seen["steps"] == {"cpu"}


def test_the_cuda_rng_state_goes_to_each_ranks_own_gpu_or_nowhere():
    a, b = torch.zeros(4, dtype=torch.uint8), torch.ones(4, dtype=torch.uint8)
    by_rank = {"cuda_by_rank": [a, b]}
    assert cuda_rng_state_for(by_rank, rank=1, device_index=1) is b
    assert cuda_rng_state_for(by_rank, rank=0, device_index=3) is a
    assert cuda_rng_state_for(by_rank, rank=2, device_index=0) is None  # a larger world
    old = {"cuda": [a, b]}  # earlier checkpoints: one state per GPU visible at save time
    assert cuda_rng_state_for(old, rank=0, device_index=None) is a
    assert cuda_rng_state_for(old, rank=0, device_index=1) is b
    assert cuda_rng_state_for({"cuda": [a]}, rank=0, device_index=1) is None  # fewer GPUs now
    assert cuda_rng_state_for({}, rank=0, device_index=0) is None


def test_rng_state_with_cuda_entries_restores_on_a_cpu():
    torch.manual_seed(3)
    state = rng_state()
    state["cuda_by_rank"] = [torch.zeros(16, dtype=torch.uint8)]
    state["cuda"] = [torch.zeros(16, dtype=torch.uint8)] * 4
    expected = torch.rand(2)
    torch.manual_seed(4)
    set_rng_state(state)  # the CPU run ignores the GPU generators
    assert torch.equal(torch.rand(2), expected)


@pytest.mark.slow
def test_fp16_trains_with_a_gradient_scaler_that_is_saved_and_resumed(tiny_mnist_dir, tmp_path):
    """--precision fp16 (a V100 or T4 plan) on a CPU: the loss is scaled, the scaler's state
    is in last.pt and a resumed run continues with it."""
    run = tmp_path / "fp16"
    results = fit(settings(tiny_mnist_dir, run, 1, precision="fp16"), log=lambda _: None)
    assert results["complete"]
    saved = load_checkpoint(run / "last.pt")
    assert saved["speed_plan"]["precision"] == "fp16"
    assert saved["grad_scaler"]["scale"] > 0 and saved["metrics"]["train_loss"] > 0
    again = fit(resumed_settings(run, settings(tiny_mnist_dir, run, 2)), resume=str(run),
                log=lambda _: None)
    assert again["epochs"] == 2
    assert "grad_scaler" in load_checkpoint(run / "last.pt")


def test_the_scaler_skips_a_step_whose_gradients_overflowed():
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    before = model.weight.detach().clone()
    def summed(model, batch, run_fraction):
        return model(batch[0]).sum() * batch[1], torch.zeros(())

    overflowing = (torch.full((1, 3), 1e38), torch.tensor(1e10))  # inf once scaled
    train_step(model, optimizer, summed, overflowing, 1.0, grad_scaler=scaler)
    assert torch.equal(model.weight, before) and scaler.get_scale() == 2.0**15
    train_step(model, optimizer, summed, (torch.ones(1, 3), torch.tensor(1.0)), 1.0,
               grad_scaler=scaler)
    assert not torch.equal(model.weight, before)


def test_keep_every_keeps_weights_only_and_refuses_to_resume_from_them(tiny_mnist_dir,
                                                                        tmp_path):
    run = tmp_path / "kept"
    fit(settings(tiny_mnist_dir, run, 1, keep_every=1), log=lambda _: None)
    kept, last = load_checkpoint(run / "epoch-001.pt"), load_checkpoint(run / "last.pt")
    assert "optimizer" not in kept and "rng" not in kept and "optimizer" in last
    assert kept["metrics"]["val_accuracy"] == last["metrics"]["val_accuracy"]
    for name, tensor in last["state_dict"].items():
        assert torch.equal(kept["state_dict"][name], tensor)
    assert (run / "epoch-001.pt").stat().st_size < 0.6 * (run / "last.pt").stat().st_size
    model = build_model(make_config("capsnet", "small"))
    model.load_state_dict(kept["state_dict"])
    with pytest.raises(CheckpointError, match="weights of one epoch only.*last.pt"):
        fit(settings(tiny_mnist_dir, tmp_path / "again", 2), resume=str(run / "epoch-001.pt"),
            log=lambda _: None)
