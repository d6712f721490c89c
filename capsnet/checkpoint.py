"""The checkpoint format, written and read in one place.

A checkpoint (.pt) holds a format marker and version, the model's name and config, its
state_dict and any training state, written atomically; a weights file (.safetensors) the
weights with the same description. :func:`load_model` takes the shipped weights (None), a
file or a model. Every problem is a one-line :class:`CheckpointError` naming the file."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capsnet.atomic import atomic_path, atomic_write
from capsnet.config import config_to_dict
from capsnet.models import MODELS, build_model, config_from_dict, model_name_of, unwrap

CHECKPOINT_FORMAT = "capsnet-checkpoint"
CHECKPOINT_VERSION = 1
WEIGHTS_FORMAT = "capsnet-weights"
WEIGHTS_SUFFIX = ".safetensors"
WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
DEFAULT_WEIGHTS = WEIGHTS_DIR / "capsnet-mnist.safetensors"

COPY_CHUNK = 1 << 24  # bytes per read when copying a checkpoint
ModelSource = None | str | os.PathLike | nn.Module


class CheckpointError(ValueError):
    """A file that is not a usable capsnet checkpoint (one line, names the file)."""


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save ``obj`` to ``path`` atomically."""
    atomic_write(path, lambda f: torch.save(obj, f))


def atomic_copy(source: str | os.PathLike, path: str | os.PathLike) -> None:
    """Copy a written checkpoint to ``path`` atomically (no second serialisation)."""
    with open(source, "rb") as src:
        atomic_write(path, lambda f: shutil.copyfileobj(src, f, length=COPY_CHUNK))


def save_checkpoint(path: str | os.PathLike, model: nn.Module, **state: Any) -> None:
    """Save the model's weights and config plus any training ``state``."""
    model = unwrap(model)
    payload = {
        "format": CHECKPOINT_FORMAT,
        "format_version": CHECKPOINT_VERSION,
        "model": model_name_of(model.config),
        "config": config_to_dict(model.config),
        "state_dict": model.state_dict(),
        **state,
    }
    atomic_torch_save(payload, path)


def save_weights(state_dict: dict, model: str, config: dict, path: str | os.PathLike,
                 dtype: torch.dtype = torch.float16, info: dict | None = None) -> Path:
    """A model's weights as a compact safetensors file (``dtype``), carrying ``info``."""
    from safetensors.torch import save_file

    tensors = {k: v.to(dtype).contiguous() for k, v in state_dict.items()}
    metadata = {"format": WEIGHTS_FORMAT, "model": model, "config": json.dumps(config),
                "info": json.dumps(info or {})}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    return Path(path)


def load_model(source: ModelSource = None, device: Any = "cpu") -> nn.Module:
    """A model in eval mode on ``device``: None the shipped CapsNet, a path a checkpoint or
    weights file (read in float32), a module as it is."""
    from safetensors.torch import load_file

    if isinstance(source, nn.Module):
        return source.to(device).eval()
    if source is None:
        if not DEFAULT_WEIGHTS.is_file():
            raise CheckpointError("no trained model ships with this installation; "
                                  "pass a checkpoint written by `capsnet train`")
        source = DEFAULT_WEIGHTS
    path = Path(source)
    if path.suffix != WEIGHTS_SUFFIX:
        return model_from_checkpoint(path, map_location=device)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such weights file")
    meta = weights_info(path)
    state = {k: v.float() for k, v in load_file(str(path)).items()}
    return _build_and_load(meta["model"], meta["config"], state, f"{path}: ").to(device).eval()


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu",
                    mmap: bool = False) -> dict:
    """Load and validate a checkpoint dict (``mmap``: tensors mapped, not read); CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as exc:  # torch raises many types for corrupt files
        raise CheckpointError(f"{path}: not a readable checkpoint ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else 'corrupt'})") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: not a capsnet checkpoint (no '{CHECKPOINT_FORMAT}' marker)")
    version = payload.get("format_version")
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {version} is not supported "
                              f"(this capsnet reads version {CHECKPOINT_VERSION})")
    if payload.get("model") not in MODELS:
        raise CheckpointError(f"{path}: unknown model {payload.get('model')!r}")
    return payload


def model_from_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> nn.Module:
    """Rebuild a checkpoint's model with its weights (eval mode) on ``map_location``; the
    file is mapped on the CPU and only the weights are read."""
    payload = load_checkpoint(path, "cpu", mmap=True)
    name = payload["model"]
    if "state_dict" not in payload or "config" not in payload:
        raise CheckpointError(f"{path}: checkpoint does not match the {name} model: it holds no "
                              f"{'state_dict' if 'config' in payload else 'config'}")
    model = _build_and_load(name, payload["config"], payload["state_dict"], f"{path}: ")
    return model.to(map_location if isinstance(map_location, (str, torch.device)) else "cpu").eval()


def weights_info(path: str | os.PathLike = DEFAULT_WEIGHTS) -> dict:
    """The metadata stored with a weights file: model, config and info."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    if meta.get("format") != WEIGHTS_FORMAT:
        raise CheckpointError(f"{path}: not a capsnet weights file")
    return {"model": meta["model"], "config": json.loads(meta["config"]),
            "info": json.loads(meta.get("info", "{}"))}


def _build_and_load(name: str, config: dict, state_dict: dict, where: str) -> nn.Module:
    try:
        model = build_model(config_from_dict(name, config))
        model.load_state_dict(state_dict)
    except (ValueError, TypeError, RuntimeError, KeyError) as exc:
        raise CheckpointError(f"{where}checkpoint does not match the {name} model: "
                              f"{error_summary(exc)}") from None
    return model


def error_summary(exc: BaseException) -> str:
    """One telling line of an exception (load_state_dict's first mismatch, not its heading)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[1] if len(lines) > 1 and lines[0].endswith(":") else lines[0]
