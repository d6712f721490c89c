"""`capsnet export`: ONNX files (run with onnxruntime) and torch.export programs match PyTorch
within 1e-5."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from capsnet.checkpoint import model_from_checkpoint
from capsnet.cli.main import main
from capsnet.export import describe, export_model, read_description
from capsnet.models import build_model, make_config

ATOL = 1e-5
BATCHES = (3, 1)  # neither is the batch of 2 the export traces with


def _images(model, batch: int, seed: int = 0) -> torch.Tensor:
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch, cfg.in_channels, cfg.image_size, cfg.image_size, generator=g)


@torch.no_grad()
def _reference(model, images: torch.Tensor) -> list[np.ndarray]:
    """What the exported file must return, from the PyTorch model itself."""
    out = model.eval()(images)
    parts = [out.scores] + ([out.reconstructions] if out.reconstructions is not None else [])
    return [p.numpy() for p in parts]


def _onnx_session(path: Path):
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def model(small_checkpoint):
    return model_from_checkpoint(small_checkpoint)


@pytest.fixture(scope="module")
def onnx_file(small_checkpoint, tmp_path_factory) -> Path:
    pytest.importorskip("onnxscript")  # the ONNX exporter needs it (and onnx)
    path = tmp_path_factory.mktemp("export") / "capsnet.onnx"
    assert main(["export", str(small_checkpoint), "--format", "onnx", "-o", str(path)]) == 0
    return path


def test_onnx_matches_pytorch_for_any_batch(model, onnx_file):
    session = _onnx_session(onnx_file)
    assert [o.name for o in session.get_outputs()] == ["lengths", "reconstructions"]
    for batch in BATCHES:
        images = _images(model, batch, seed=batch)
        lengths, recon = session.run(None, {"images": images.numpy()})
        ref_lengths, ref_recon = _reference(model, images)
        assert lengths.shape == (batch, model.config.num_classes)
        assert recon.shape == (batch, 1, model.config.image_size, model.config.image_size)
        np.testing.assert_allclose(lengths, ref_lengths, atol=ATOL, rtol=0)
        np.testing.assert_allclose(recon, ref_recon, atol=ATOL, rtol=0)


def test_onnx_reconstruction_is_of_the_predicted_class(model, onnx_file):
    """The exported decoder is masked by the longest capsule: the same image as when the
    PyTorch model is given the predicted labels."""
    images = _images(model, 4, seed=7)
    lengths, recon = _onnx_session(onnx_file).run(None, {"images": images.numpy()})
    with torch.no_grad():
        wanted = model(images, torch.from_numpy(lengths).argmax(-1)).reconstructions
    np.testing.assert_allclose(recon, wanted.numpy(), atol=ATOL, rtol=0)


def test_the_torch_export_program_matches_pytorch(model, small_checkpoint, tmp_path, capsys):
    path = tmp_path / "capsnet.pt2"
    assert main(["export", str(small_checkpoint), "--format", "pt2", "-o", str(path)]) == 0
    assert "(pt2): input images (batch, 1, 28, 28) in [0, 1] -> lengths, reconstructions" in (
        capsys.readouterr().out)
    loaded = torch.export.load(str(path)).module()
    for batch in BATCHES:
        images = _images(model, batch, seed=batch)
        with torch.no_grad():
            got = [t.numpy() for t in loaded(images)]
        for a, b in zip(got, _reference(model, images), strict=True):
            np.testing.assert_allclose(a, b, atol=ATOL, rtol=0)
    assert read_description(path) == json.loads(json.dumps(describe(model)))


def test_default_output_name_is_beside_the_checkpoint(small_checkpoint, tmp_path):
    source = tmp_path / "run" / "best.pt"
    source.parent.mkdir()
    source.write_bytes(Path(small_checkpoint).read_bytes())
    with pytest.warns(FutureWarning, match="'torchscript' is deprecated .* writing 'pt2'"):
        assert main(["export", str(source), "--format", "torchscript"]) == 0
    assert (source.parent / "best.pt2").is_file()  # the deprecated name writes a program


@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_other_models_export(fmt, tmp_path):
    """The CNN baseline exports its probabilities; a CapsNet without decoder, its lengths; a
    colour 32x32 CapsNet of named classes, (B, 3, 32, 32) in and out, its names described."""
    if fmt == "onnx":
        pytest.importorskip("onnxscript")  # the ONNX exporter needs it (and onnx)
    torch.manual_seed(0)
    colour = make_config("capsnet", "small", in_channels=3, image_size=32, num_classes=3,
                         class_names=("cat", "dog", "ship"), dataset="folder")
    for config, outputs in [(make_config("cnn", "small"), ["probabilities"]),
                            (make_config("capsnet", "small", use_decoder=False), ["lengths"]),
                            (colour, ["lengths", "reconstructions"])]:
        model = build_model(config).eval()
        path = export_model(model, tmp_path / f"m.{fmt}", fmt)
        info = read_description(path)
        assert info["outputs"] == outputs
        assert info["input_shape"] == ["batch", config.in_channels, config.image_size,
                                       config.image_size]
        assert info["class_names"] == (list(config.class_names) or [str(j) for j in range(10)])
        assert all(p.requires_grad for p in model.parameters())  # the model is left as it was
        images = _images(model, 3)
        if fmt == "onnx":
            got = _onnx_session(path).run(None, {"images": images.numpy()})
        else:
            with torch.no_grad():
                got = [t.numpy() for t in torch.export.load(str(path)).module()(images)]
        for a, b in zip(got, _reference(model, images), strict=True):
            np.testing.assert_allclose(a, b, atol=ATOL, rtol=0)


def test_not_a_checkpoint_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "notes.pt"
    bad.write_text("not a checkpoint")
    out = tmp_path / "out.onnx"
    assert main(["export", str(bad), "--format", "onnx", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("capsnet: error: ") and str(bad) in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()
    assert main(["export", str(tmp_path / "missing.pt")]) == 1
    assert "no such checkpoint file" in capsys.readouterr().err
