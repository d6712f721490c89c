"""Inference models for other runtimes: ONNX and TorchScript files from a trained model.

The exported model takes float images (B, C, H, W) in [0, 1] (B is dynamic) and returns
CapsNet's capsule lengths (B, J) and the reconstructions (B, C, H, W) of the predicted
class (lengths alone for a CapsNet without decoder; the CNN baseline returns its softmax
probabilities (B, J), the EM capsule network its class activations (B, J)). The model's
configuration and these names are stored in the file (ONNX metadata_props, TorchScript
extra file ``capsnet.json``), with the input shape and the classes' names in output order.
"""
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
from capsnet.classes import class_names
from capsnet.config import config_to_dict
from capsnet.models import CapsuleOutput, class_scores, entry_of

FORMATS = ("onnx", "torchscript")
SUFFIXES = {"onnx": ".onnx", "torchscript": ".ts.pt"}  # default file names: <stem><suffix>
ONNX_OPSET = 17  # a model's registry entry may ask for a later one (onnx_opset)
INPUT_NAME = "images"
BATCH_AXIS = "batch"
EXAMPLE_BATCH = 2  # traced with this batch; the batch dimension stays dynamic
METADATA_FILE = "capsnet.json"  # TorchScript extra file holding the description


class InferenceModel(nn.Module):
    """A trained model as a pure function of its input, for export.

    Input images (B, C, H, W) float in [0, 1]. Output a tuple named by
    :func:`output_names`: the class scores (B, J) (the registry entry's ``scores``: capsule
    lengths, EM's activations, the CNN's probabilities), then the reconstructions
    (B, C, H, W) of a model with a decoder, masked by the highest-scoring capsule.
    """

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
    """What is stored with an exported file: model name, config, the input's name, shape
    (B, C, H, W) and range, the output names, and the classes' names in output order."""
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
    """Write ``model`` (a CapsNet or CNNBaseline) as an inference file in ``fmt``
    ('onnx' or 'torchscript'). Returns the path written. ``model`` itself is left as it
    was (a frozen CPU copy is exported)."""
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
    """The TorchScript-based exporter (dynamo=False): no extra dependency beyond onnx,
    and the batch dimension made dynamic by ``dynamic_axes``."""
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
    """torch.jit.trace: the routing loop has a fixed number of iterations, so the trace is
    the whole computation; sizes are recorded as operations, so any batch size works."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch 2.13 marks torch.jit deprecated
        traced = torch.jit.trace(wrapper, (example,))
        torch.jit.save(traced, str(path), _extra_files={METADATA_FILE: json.dumps(info)})


def export_weights(checkpoint: str | os.PathLike, out_path: str | os.PathLike,
                   dtype: torch.dtype = torch.float16, info: dict | None = None) -> Path:
    """Write a checkpoint's model as a compact safetensors file (weights in ``dtype``),
    carrying the model name, its configuration and ``info`` (e.g. measured accuracy)."""
    payload = load_checkpoint(checkpoint)
    return save_weights(payload["state_dict"], payload["model"], payload["config"], out_path,
                        dtype, info)


def export_run_weights(checkpoint: str | os.PathLike,
                       path: str | os.PathLike | None = None) -> Path:
    """float16 safetensors weights of a checkpoint, carrying its run's headline results
    (results.json beside it, confusion matrices left out) as info. ``path`` None writes
    beside the checkpoint: best.pt -> best.safetensors."""
    checkpoint = Path(checkpoint)
    results = checkpoint.parent / "results.json"
    info = json.loads(results.read_text()) if results.is_file() else {}
    for key in ("final", "best"):  # keep the headline numbers, drop the confusion matrices
        if isinstance(info.get(key), dict):
            info[key] = {k: info[key][k] for k in ("accuracy", "error") if k in info[key]}
    return export_weights(checkpoint, path or checkpoint.with_suffix(WEIGHTS_SUFFIX), info=info)


def export_checkpoint(source: str | os.PathLike, path: str | os.PathLike | None,
                      fmt: str) -> Path:
    """Export the model of a checkpoint (.pt) or weights file (.safetensors) as ``fmt``
    (FORMATS, or 'safetensors' for compact weights of a checkpoint). ``path`` None writes
    beside the source: best.pt -> best.onnx, best.ts.pt or best.safetensors."""
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
