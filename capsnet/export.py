"""Inference models for other runtimes, written the current PyTorch way: ONNX by the
dynamo-based exporter (``torch.onnx.export(dynamo=True)``) and a ``torch.export`` program
(``.pt2``, ``torch.export.load``). TorchScript is deprecated by PyTorch: ``torchscript`` is
kept one release as an alias of ``pt2`` that says so.

The exported model takes float images (B, C, H, W) in [0, 1] (B dynamic) and returns the
class scores (B, J) and, with a decoder, the reconstructions (B, C, H, W); the config and
these names are stored in the file (ONNX metadata, the program's extra file ``capsnet.json``)."""
from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capsnet.atomic import atomic_path
from capsnet.checkpoint import WEIGHTS_SUFFIX, load_checkpoint, load_model, save_weights
from capsnet.config import config_to_dict
from capsnet.data.model_view import class_names
from capsnet.losses import SCORE_NAMES
from capsnet.models import entry_of

FORMATS = ("onnx", "pt2", "torchscript")
DEPRECATED_FORMATS = {"torchscript": "pt2"}  # deprecated name -> the format it writes
SUFFIXES = {"onnx": ".onnx", "pt2": ".pt2"}  # default file names: <stem><suffix>
ONNX_OPSET = 18  # EM routing's scatter-max: ScatterElements' reduction 'max' is opset 18
INPUT_NAME = "images"
BATCH_AXIS = "batch"
EXAMPLE_BATCH = 2  # exported with this batch; the batch dimension stays dynamic
METADATA_FILE = "capsnet.json"  # the program's extra file holding the description


class InferenceModel(nn.Module):
    """A trained model as a pure function for export: images (B, C, H, W) in [0, 1] -> the
    class scores (B, J) and, with a decoder, the reconstructions of the best capsule."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model.eval()

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(images)
        if out.reconstructions is None:
            return (out.scores,)  # (B, J)
        return out.scores, out.reconstructions  # (B, J), (B, C, H, W)


def describe(model: nn.Module) -> dict:
    """What is stored with an exported file: model, config, input, outputs, class names. The
    outputs are named from what the model returns (one blank image, eval mode): its scores
    by the loss that trains them (capsnet.losses.SCORE_NAMES), the reconstructions if any."""
    cfg, was_training = model.config, model.training
    with torch.no_grad():
        out = model.eval()(torch.zeros(1, cfg.in_channels, cfg.image_size, cfg.image_size,
                                       device=next(model.parameters()).device))
    model.train(was_training)
    outputs = [SCORE_NAMES[out.loss]] + ([] if out.reconstructions is None else ["reconstructions"])
    return {"format": "capsnet-export", "model": entry_of(cfg).name,
            "config": config_to_dict(cfg), "input": INPUT_NAME,
            "input_shape": [BATCH_AXIS, cfg.in_channels, cfg.image_size, cfg.image_size],
            "input_range": [0.0, 1.0], "outputs": outputs,
            "class_names": class_names(cfg), "dataset": cfg.dataset}


def check_format(fmt: str) -> str:
    """The format ``fmt`` writes (a deprecated name's replacement, with a warning); a
    ValueError naming the choices for an unknown one."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose from {list(FORMATS)}")
    if fmt in DEPRECATED_FORMATS:
        warnings.warn(f"export format {fmt!r} is deprecated (PyTorch deprecates TorchScript); "
                      f"writing {DEPRECATED_FORMATS[fmt]!r}, a torch.export program: load it "
                      f"with torch.export.load(path).module()", FutureWarning, stacklevel=3)
    return DEPRECATED_FORMATS.get(fmt, fmt)


def export_model(model: nn.Module, path: str | os.PathLike, fmt: str) -> Path:
    """Write a frozen CPU copy of ``model`` as ``fmt`` (onnx or pt2); returns the path. Both
    start from one ``torch.export`` program with a dynamic batch."""
    fmt = check_format(fmt)
    model = copy.deepcopy(model).to("cpu").eval().requires_grad_(False)
    cfg, info = model.config, describe(model)
    example = torch.rand(EXAMPLE_BATCH, cfg.in_channels, cfg.image_size, cfg.image_size,
                         generator=torch.Generator().manual_seed(0))  # (B, C, H, W) in [0, 1]
    wrapper, dynamic = InferenceModel(model), ({0: torch.export.Dim(BATCH_AXIS, min=1)},)
    with torch.no_grad(), atomic_path(path) as tmp:
        if fmt == "pt2":
            program = torch.export.export(wrapper, (example,), dynamic_shapes=dynamic)
            with warnings.catch_warnings():  # views sharing a storage: harmless on the CPU
                warnings.filterwarnings("ignore", "No complete tensor found", UserWarning)
                torch.export.save(program, str(tmp), extra_files={METADATA_FILE: json.dumps(info)})
            return Path(path)
        try:
            import onnx
            import onnxscript  # noqa: F401  (the dynamo exporter's)
        except ImportError as exc:
            raise ValueError(f"ONNX export needs the {exc.name!r} package: "
                             f'pip install "capsnet[export]"') from None
        with quiet_onnx_exporter():
            torch.onnx.export(wrapper, (example,), str(tmp), dynamo=True, opset_version=ONNX_OPSET,
                              input_names=[INPUT_NAME], output_names=info["outputs"],
                              dynamic_shapes=dynamic, verbose=False)
        proto = onnx.load(str(tmp))
        entry = proto.metadata_props.add()
        entry.key, entry.value = METADATA_FILE, json.dumps(info)
        onnx.save(proto, str(tmp))
    return Path(path)


@contextlib.contextmanager
def quiet_onnx_exporter():
    """Hold back the dynamo exporter's progress lines and notes (e.g. on torchvision)."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def export_weights(checkpoint: str | os.PathLike, out_path: str | os.PathLike,
                   dtype: torch.dtype = torch.float16, info: dict | None = None) -> Path:
    """A checkpoint's model as a compact safetensors file (``dtype``), carrying ``info``."""
    payload = load_checkpoint(checkpoint)
    return save_weights(payload["state_dict"], payload["model"], payload["config"], out_path,
                        dtype, info)


def export_checkpoint(source: str | os.PathLike, path: str | os.PathLike | None,
                      fmt: str) -> Path:
    """Export a checkpoint or weights file as ``fmt``; ``path`` None writes beside the source.
    'safetensors': float16 weights with the run's headline results (best.pt -> best.safetensors)."""
    source = Path(source)
    if fmt == "safetensors":
        results = source.parent / "results.json"
        info = json.loads(results.read_text()) if results.is_file() else {}
        for key in ("final", "best"):  # keep the headline numbers, drop the confusion matrices
            if isinstance(info.get(key), dict):
                info[key] = {k: info[key][k] for k in ("accuracy", "error") if k in info[key]}
        return export_weights(source, path or source.with_suffix(WEIGHTS_SUFFIX), info=info)
    fmt = check_format(fmt)
    model = load_model(source, device="cpu")
    return export_model(model, path or source.with_name(source.stem + SUFFIXES[fmt]), fmt)


def read_description(path: str | os.PathLike) -> dict[str, Any]:
    """The description stored in an exported ONNX file or torch.export program."""
    path = Path(path)
    if path.suffix == SUFFIXES["onnx"]:
        import onnx

        props = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
        return json.loads(props[METADATA_FILE])
    files = {METADATA_FILE: ""}
    torch.export.load(str(path), extra_files=files)
    return json.loads(files[METADATA_FILE])
