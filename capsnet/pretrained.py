"""The trained model that ships with the package, and loading any model a user names."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from capsnet.config import config_from_dict
from capsnet.models import build_model
from capsnet.training.checkpoint import (CheckpointError, error_summary, load_checkpoint,
                                         model_from_checkpoint)

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
DEFAULT_WEIGHTS = WEIGHTS_DIR / "capsnet-mnist.safetensors"


def export_weights(checkpoint: str | os.PathLike, out_path: str | os.PathLike,
                   dtype: torch.dtype = torch.float16, info: Optional[dict] = None) -> Path:
    """Write a checkpoint's model as a compact safetensors file (weights in ``dtype``),
    carrying the model name, its configuration and ``info`` (e.g. measured accuracy)."""
    from safetensors.torch import save_file

    payload = load_checkpoint(checkpoint)
    tensors = {k: v.to(dtype).contiguous() for k, v in payload["state_dict"].items()}
    metadata = {"format": "capsnet-weights", "model": payload["model"],
                "config": json.dumps(payload["config"]), "info": json.dumps(info or {})}
    out_path = Path(out_path)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, out_path)
    return out_path


def weights_info(path: str | os.PathLike = DEFAULT_WEIGHTS) -> dict:
    """The metadata stored with a weights file: model, config and info."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    if meta.get("format") != "capsnet-weights":
        raise CheckpointError(f"{path}: not a capsnet weights file")
    return {"model": meta["model"], "config": json.loads(meta["config"]),
            "info": json.loads(meta.get("info", "{}"))}


def load_weights(path: str | os.PathLike = DEFAULT_WEIGHTS, device: Any = "cpu") -> nn.Module:
    """Rebuild a model from a safetensors weights file, in float32, in eval mode."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such weights file")
    meta = weights_info(path)
    model = build_model(config_from_dict(meta["model"], meta["config"]))
    state = {k: v.float() for k, v in load_file(str(path)).items()}
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise CheckpointError(f"{path}: weights do not match the {meta['model']} model: "
                              f"{error_summary(exc)}") from None
    return model.to(device).eval()


def load_model(source: Optional[str | os.PathLike] = None, device: Any = "cpu") -> nn.Module:
    """A model from a training checkpoint (.pt), a weights file (.safetensors), or, when
    ``source`` is None, the trained CapsNet shipped with the package."""
    if source is None:
        if not DEFAULT_WEIGHTS.is_file():
            raise CheckpointError("no trained model ships with this installation; "
                                  "pass a checkpoint written by `capsnet train`")
        return load_weights(DEFAULT_WEIGHTS, device)
    if Path(source).suffix == ".safetensors":
        return load_weights(source, device)
    return model_from_checkpoint(source, map_location=device)
