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

from capsnet.config import class_names, config_to_dict
from capsnet.loading import WEIGHTS_FORMAT, WEIGHTS_SUFFIX, load_checkpoint, load_model
from capsnet.models import (
    CapsNet,
    CapsuleOutput,
    EfficientCapsNet,
    EMCapsNet,
    MatrixCapsuleOutput,
    model_name_of,
)

FORMATS = ("onnx", "torchscript")
SUFFIXES = {"onnx": ".onnx", "torchscript": ".ts.pt"}  # default file names: <stem><suffix>
ONNX_OPSET = 17
# EM routing normalises each child's assignments over its parents by a scatter-max (for a
# stable logsumexp): ONNX's ScatterElements reduction 'max' is opset 18.
EM_ONNX_OPSET = 18
INPUT_NAME = "images"
BATCH_AXIS = "batch"
EXAMPLE_BATCH = 2  # traced with this batch; the batch dimension stays dynamic
METADATA_FILE = "capsnet.json"  # TorchScript extra file holding the description
CAPSULE_MODELS = (CapsNet, EfficientCapsNet)  # models whose output is a CapsuleOutput


class InferenceModel(nn.Module):
    """A trained model as a pure function of its input, for export.

    Input images (B, C, H, W) float in [0, 1]. Output a tuple named by
    :func:`output_names`: (lengths (B, J), reconstructions (B, C, H, W)) for CapsNet and
    Efficient-CapsNet, the reconstruction masked by the longest capsule; (probabilities
    (B, J),) for the CNN.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.eval()

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(images)
        if isinstance(out, MatrixCapsuleOutput):
            return (out.activations,)  # (B, J)
        if not isinstance(out, CapsuleOutput):
            return (torch.softmax(out, dim=-1),)  # (B, J)
        if out.reconstructions is None:
            return (out.lengths,)  # (B, J)
        return out.lengths, out.reconstructions  # (B, J), (B, C, H, W)


def output_names(model: nn.Module) -> list[str]:
    """Names of the exported outputs, in order."""
    if isinstance(model, EMCapsNet):
        return ["activations"]
    if not isinstance(model, CAPSULE_MODELS):
        return ["probabilities"]
    return ["lengths", "reconstructions"] if model.decoder is not None else ["lengths"]


def describe(model: nn.Module) -> dict:
    """What is stored with an exported file: model name, config, the input's name, shape
    (B, C, H, W) and range, the output names, and the classes' names in output order."""
    cfg = model.config
    return {"format": "capsnet-export", "model": model_name_of(cfg),
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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        if fmt == "onnx":
            opset = EM_ONNX_OPSET if isinstance(model, EMCapsNet) else ONNX_OPSET
            _export_onnx(wrapper, example, path, describe(model), opset)
        else:
            _export_torchscript(wrapper, example, path, describe(model))
    return path


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
    from safetensors.torch import save_file

    payload = load_checkpoint(checkpoint)
    tensors = {k: v.to(dtype).contiguous() for k, v in payload["state_dict"].items()}
    metadata = {"format": WEIGHTS_FORMAT, "model": payload["model"],
                "config": json.dumps(payload["config"]), "info": json.dumps(info or {})}
    out_path = Path(out_path)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, out_path)
    return out_path


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
