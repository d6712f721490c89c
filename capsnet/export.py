"""Inference models for other runtimes: ONNX and TorchScript files from a trained model.

The exported model takes float images (B, C, H, W) in [0, 1] (B dynamic) and returns the
class scores (B, J) and, with a decoder, the reconstructions (B, C, H, W); the config and
these names are stored in the file (ONNX metadata, TorchScript ``capsnet.json``)."""
from __future__ import annotations

import copy
import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capsnet.atomic import atomic_path
from capsnet.checkpoint import WEIGHTS_SUFFIX, load_checkpoint, load_model, save_weights
from capsnet.config import class_names, config_to_dict
from capsnet.models import CapsuleOutput, class_scores, entry_of

FORMATS = ("onnx", "torchscript")
SUFFIXES = {"onnx": ".onnx", "torchscript": ".ts.pt"}  # default file names: <stem><suffix>
ONNX_OPSET = 17  # a model's registry entry may ask for a later one (onnx_opset)
INPUT_NAME = "images"
BATCH_AXIS = "batch"
EXAMPLE_BATCH = 2  # traced with this batch; the batch dimension stays dynamic
METADATA_FILE = "capsnet.json"  # TorchScript extra file holding the description


class InferenceModel(nn.Module):
    """A trained model as a pure function for export: images (B, C, H, W) in [0, 1] -> the
    class scores (B, J) and, with a decoder, the reconstructions of the best capsule."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.eval()

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(images)
        scores = class_scores(out)  # (B, J)
        if not isinstance(out, CapsuleOutput) or out.reconstructions is None:
            return (scores,)
        return scores, out.reconstructions  # (B, J), (B, C, H, W)


def output_names(model: nn.Module) -> list[str]:
    """Names of the exported outputs, in order."""
    scores = entry_of(model.config).scores
    return [scores, "reconstructions"] if getattr(model, "decoder", None) else [scores]


def describe(model: nn.Module) -> dict:
    """What is stored with an exported file: model, config, input, outputs, class names."""
    cfg = model.config
    return {"format": "capsnet-export", "model": entry_of(cfg).name,
            "config": config_to_dict(cfg), "input": INPUT_NAME,
            "input_shape": [BATCH_AXIS, cfg.in_channels, cfg.image_size, cfg.image_size],
            "input_range": [0.0, 1.0], "outputs": output_names(model),
            "class_names": class_names(cfg), "dataset": cfg.dataset}


def example_input(model: nn.Module, batch: int = EXAMPLE_BATCH) -> torch.Tensor:
    """Random images (batch, C, H, W) in [0, 1] matching the model's configuration."""
    cfg = model.config
    generator = torch.Generator().manual_seed(0)
    return torch.rand(batch, cfg.in_channels, cfg.image_size, cfg.image_size, generator=generator)


def export_model(model: nn.Module, path: str | os.PathLike, fmt: str) -> Path:
    """Write a frozen CPU copy of ``model`` as ``fmt`` (onnx or torchscript); returns the path."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose from {list(FORMATS)}")
    model = copy.deepcopy(model).to("cpu").eval().requires_grad_(False)
    wrapper, example = InferenceModel(model), example_input(model)
    opset = entry_of(model.config).onnx_opset or ONNX_OPSET
    with torch.no_grad(), atomic_path(path) as tmp:
        if fmt == "onnx":
            _export_onnx(wrapper, example, tmp, describe(model), opset)
        else:
            _export_torchscript(wrapper, example, tmp, describe(model))
    return Path(path)


def _export_onnx(wrapper: InferenceModel, example: torch.Tensor, path: Path, info: dict,
                 opset: int = ONNX_OPSET) -> None:
    """The TorchScript-based exporter (dynamo=False), the batch dimension dynamic."""
    try:
        import onnx
    except ImportError:
        raise ValueError("ONNX export needs the 'onnx' package (pip install onnx)") from None
    names = info["outputs"]
    axes = {name: {0: BATCH_AXIS} for name in [INPUT_NAME, *names]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation and tracer notes
        torch.onnx.export(wrapper, (example,), str(path), dynamo=False, opset_version=opset,
                          input_names=[INPUT_NAME], output_names=names, dynamic_axes=axes)
    proto = onnx.load(str(path))
    entry = proto.metadata_props.add()
    entry.key, entry.value = METADATA_FILE, json.dumps(info)
    onnx.save(proto, str(path))


def _export_torchscript(wrapper: InferenceModel, example: torch.Tensor, path: Path,
                        info: dict) -> None:
    """torch.jit.trace: the routing has a fixed number of iterations, so the trace is whole."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.13 marks torch.jit deprecated
        traced = torch.jit.trace(wrapper, (example,))
        torch.jit.save(traced, str(path), _extra_files={METADATA_FILE: json.dumps(info)})


def export_weights(checkpoint: str | os.PathLike, out_path: str | os.PathLike,
                   dtype: torch.dtype = torch.float16, info: dict | None = None) -> Path:
    """A checkpoint's model as a compact safetensors file (``dtype``), carrying ``info``."""
    payload = load_checkpoint(checkpoint)
    return save_weights(payload["state_dict"], payload["model"], payload["config"], out_path,
                        dtype, info)


def export_run_weights(checkpoint: str | os.PathLike,
                       path: str | os.PathLike | None = None) -> Path:
    """float16 safetensors weights of a checkpoint with its run's headline results; ``path``
    None writes best.pt -> best.safetensors."""
    checkpoint = Path(checkpoint)
    results = checkpoint.parent / "results.json"
    info = json.loads(results.read_text()) if results.is_file() else {}
    for key in ("final", "best"):  # keep the headline numbers, drop the confusion matrices
        if isinstance(info.get(key), dict):
            info[key] = {k: info[key][k] for k in ("accuracy", "error") if k in info[key]}
    return export_weights(checkpoint, path or checkpoint.with_suffix(WEIGHTS_SUFFIX), info=info)


def export_checkpoint(source: str | os.PathLike, path: str | os.PathLike | None,
                      fmt: str) -> Path:
    """Export a checkpoint or weights file as ``fmt`` (or 'safetensors'); ``path`` None writes
    beside the source."""
    if fmt == "safetensors":
        return export_run_weights(source, path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose from {list(FORMATS)}")
    model = load_model(source, device="cpu")
    if path is None:
        source = Path(source)
        path = source.with_name(source.stem + SUFFIXES[fmt])
    return export_model(model, path, fmt)


def read_description(path: str | os.PathLike) -> dict[str, Any]:
    """The description stored in an exported ONNX or TorchScript file."""
    path = Path(path)
    if path.suffix == SUFFIXES["onnx"]:
        import onnx

        props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
        return json.loads(props[METADATA_FILE])
    files = {METADATA_FILE: ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.load(str(path), map_location="cpu", _extra_files=files)
    return json.loads(files[METADATA_FILE])
