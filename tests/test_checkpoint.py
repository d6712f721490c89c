"""Checkpoints: round trips, atomic writes, and a clear one-line CheckpointError for bad files."""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import capsnet.checkpoint as loading
from capsnet.checkpoint import (
    CHECKPOINT_VERSION,
    CheckpointError,
    atomic_copy,
    atomic_torch_save,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
from capsnet.models import build_model, make_config


def small(name: str = "capsnet", **overrides) -> nn.Module:
    torch.manual_seed(0)
    return build_model(make_config(name, "small", **overrides)).eval()


@pytest.fixture
def saved(tmp_path):
    """A valid CapsNet checkpoint file and its model."""
    model = small()
    path = tmp_path / "model.pt"
    save_checkpoint(path, model, epoch=3)
    return path, model


def one_line_error(path) -> str:
    with pytest.raises(CheckpointError) as info:
        model_from_checkpoint(path)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("name", ["capsnet", "cnn"])
def test_round_trip_gives_identical_outputs(tmp_path, name):
    model = small(name, num_classes=7)
    path = tmp_path / "m.pt"
    save_checkpoint(path, model, epoch=5, note="hello")
    loaded = model_from_checkpoint(path)
    assert type(loaded) is type(model) and loaded.config == model.config
    assert not loaded.training
    x = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        a, b = model(x), loaded(x)
    for t_a, t_b in zip(a, b, strict=True):  # ModelOutput's fields: tensors, None, the loss
        assert torch.equal(t_a, t_b) if isinstance(t_a, torch.Tensor) else t_a == t_b
    payload = load_checkpoint(path)
    assert payload["epoch"] == 5 and payload["note"] == "hello"
    assert payload["model"] == name and payload["format_version"] == CHECKPOINT_VERSION


def test_a_wrapped_model_is_saved_as_the_plain_module(tmp_path):
    class Wrapper(nn.Module):  # like DistributedDataParallel: the model in .module
        def __init__(self, module):
            super().__init__()
            self.module = module

    model = small()
    save_checkpoint(tmp_path / "w.pt", Wrapper(model))
    state = load_checkpoint(tmp_path / "w.pt")["state_dict"]
    assert state.keys() == model.state_dict().keys()


def test_atomic_write_leaves_no_temporary_files(tmp_path, saved):
    path, model = saved
    save_checkpoint(path, model, epoch=4)  # overwrite in place
    assert sorted(os.listdir(tmp_path)) == ["model.pt"]
    assert load_checkpoint(path)["epoch"] == 4


def test_interrupted_write_keeps_the_old_file(tmp_path, saved, monkeypatch):
    path, model = saved
    before = path.read_bytes()

    def broken_save(obj, f):
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(loading.torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, model, epoch=9)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["model.pt"]
    assert load_checkpoint(path)["epoch"] == 3


def test_atomic_torch_save_creates_parent_directories(tmp_path):
    target = tmp_path / "a" / "b" / "x.pt"
    atomic_torch_save({"k": torch.arange(3)}, target)
    assert torch.equal(torch.load(target, weights_only=True)["k"], torch.arange(3))


def test_atomic_copy_gives_the_same_bytes_and_an_interrupted_copy_keeps_the_old_file(
        tmp_path, monkeypatch):
    source, target = tmp_path / "last.pt", tmp_path / "best.pt"
    atomic_torch_save({"k": torch.arange(5)}, source)
    atomic_torch_save({"k": torch.zeros(2)}, target)
    before = target.read_bytes()

    def broken_copy(src, dst, length=0):
        dst.write(src.read(10))
        raise OSError("disk full")

    monkeypatch.setattr(loading.shutil, "copyfileobj", broken_copy)
    with pytest.raises(OSError, match="disk full"):
        atomic_copy(source, target)
    monkeypatch.undo()
    assert target.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["best.pt", "last.pt"]
    atomic_copy(source, target)
    assert target.read_bytes() == source.read_bytes()


def test_missing_file(tmp_path):
    message = one_line_error(tmp_path / "nope.pt")
    assert "nope.pt" in message and "no such checkpoint" in message


def test_corrupt_file(tmp_path):
    path = tmp_path / "garbage.pt"
    path.write_bytes(os.urandom(2000))
    message = one_line_error(path)
    assert "garbage.pt" in message and "not a readable checkpoint" in message


def test_truncated_checkpoint(saved):
    path, _ = saved
    path.write_bytes(path.read_bytes()[:5000])
    assert "not a readable checkpoint" in one_line_error(path)


@pytest.mark.parametrize("obj", [{"weights": torch.zeros(3)}, torch.zeros(2), [1, 2, 3]])
def test_a_file_that_is_not_a_capsnet_checkpoint(tmp_path, obj):
    path = tmp_path / "other.pt"
    torch.save(obj, path)
    message = one_line_error(path)
    assert "other.pt" in message and "not a capsnet checkpoint" in message


def test_unsupported_format_version(saved):
    path, _ = saved
    payload = torch.load(path, weights_only=True)
    payload["format_version"] = CHECKPOINT_VERSION + 1
    torch.save(payload, path)
    message = one_line_error(path)
    assert f"version {CHECKPOINT_VERSION + 1}" in message and "not supported" in message


def test_unknown_model_name(saved):
    path, _ = saved
    payload = torch.load(path, weights_only=True)
    payload["model"] = "transformer"
    torch.save(payload, path)
    assert "unknown model 'transformer'" in one_line_error(path)


def test_weights_of_a_different_size_config(saved):
    path, _ = saved
    payload = torch.load(path, weights_only=True)
    payload["state_dict"] = small(conv1_channels=16).state_dict()  # config still says 32
    torch.save(payload, path)
    message = one_line_error(path)
    assert "does not match the capsnet model" in message
    assert "size mismatch for conv1.weight" in message  # the detail, not just a heading


def test_missing_and_unknown_config_keys(saved):
    path, _ = saved
    payload = torch.load(path, weights_only=True)
    payload["config"]["colour"] = "blue"
    torch.save(payload, path)
    assert "colour" in one_line_error(path)
    del payload["state_dict"]
    payload["config"].pop("colour")
    torch.save(payload, path)
    assert "does not match" in one_line_error(path)


def test_load_model_reads_training_checkpoints(saved):
    path, model = saved
    loaded = loading.load_model(path)
    x = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(loaded(x).scores, model(x).scores)


def test_load_model_without_shipped_weights_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "DEFAULT_WEIGHTS", tmp_path / "absent.safetensors")
    with pytest.raises(CheckpointError, match="no trained model ships"):
        loading.load_model(None)
