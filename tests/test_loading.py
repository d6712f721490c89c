"""Compact safetensors weights: export, reload, metadata, errors, and the shipped model."""
import json

import pytest
import torch

from capsnet import checkpoint as loading
from capsnet.checkpoint import CheckpointError, load_model, model_from_checkpoint, weights_info
from capsnet.cli.main import main
from capsnet.export import export_weights


def test_weights_round_trip_matches_checkpoint(small_checkpoint, tmp_path):
    out = export_weights(small_checkpoint, tmp_path / "w.safetensors", info={"note": "x"})
    original = model_from_checkpoint(small_checkpoint)
    reloaded = load_model(out)
    x = torch.rand(4, 1, 28, 28)
    with torch.no_grad():
        a, b = original(x), reloaded(x)
    # float16 storage: about 3 significant digits
    torch.testing.assert_close(b.scores, a.scores, atol=2e-3, rtol=1e-2)
    assert torch.equal(b.scores.argmax(-1), a.scores.argmax(-1))
    info = weights_info(out)
    assert info["model"] == "capsnet" and info["info"] == {"note": "x"}
    assert info["config"]["conv1_channels"] == original.config.conv1_channels
    assert all(p.dtype == torch.float32 for p in reloaded.parameters())


def test_export_cli_safetensors_carries_results(small_checkpoint, tmp_path, capsys):
    out = tmp_path / "model.safetensors"
    assert main(["export", str(small_checkpoint), "--format", "safetensors", "-o", str(out)]) == 0
    results = json.loads((small_checkpoint.parent / "results.json").read_text())
    assert weights_info(out)["info"]["best"]["accuracy"] == results["best"]["accuracy"]
    assert isinstance(load_model(out), torch.nn.Module)


def test_bad_weights_files_give_clear_errors(tmp_path, monkeypatch):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not safetensors at all")
    with pytest.raises(CheckpointError, match="junk.safetensors"):
        load_model(junk)
    with pytest.raises(CheckpointError, match="no such weights file"):
        load_model(tmp_path / "absent.safetensors")
    monkeypatch.setattr(loading, "DEFAULT_WEIGHTS", tmp_path / "absent.safetensors")
    with pytest.raises(CheckpointError, match="no trained model ships"):
        load_model(None)
