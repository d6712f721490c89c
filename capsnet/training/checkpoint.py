"""Self-describing checkpoints: written atomically, checked on load, rebuild their model."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from capsnet.config import config_from_dict, config_to_dict
from capsnet.models import MODELS, build_model, model_name_of

CHECKPOINT_FORMAT = "capsnet-checkpoint"
CHECKPOINT_VERSION = 1


class CheckpointError(ValueError):
    """A file that is not a usable capsnet checkpoint (one line, names the file)."""


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save to a temporary file beside ``path``, fsync, then rename over it, so an
    interrupted write never leaves a half-written checkpoint under the real name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside DDP / torch.compile wrappers."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


def save_checkpoint(path: str | os.PathLike, model: nn.Module, **state: Any) -> None:
    """Save the model's weights and configuration plus any training ``state``
    (optimizer, scheduler, epoch, RNG, metrics...)."""
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


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict:
    """Load and validate a checkpoint dict; raises CheckpointError with a clear message."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
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


def error_summary(exc: BaseException) -> str:
    """One telling line of an exception. load_state_dict's first line is only a heading
    ('Error(s) in loading state_dict for CapsNet:'); the first mismatch is on the next."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[1] if len(lines) > 1 and lines[0].endswith(":") else lines[0]


def model_from_checkpoint(path_or_payload, map_location: Any = "cpu",
                          expected_model: Optional[str] = None) -> nn.Module:
    """Rebuild the model a checkpoint describes and load its weights (eval mode)."""
    from_file = not isinstance(path_or_payload, dict)
    payload = load_checkpoint(path_or_payload, map_location) if from_file else path_or_payload
    where = f"{path_or_payload}: " if from_file else ""
    name = payload["model"]
    if expected_model is not None and name != expected_model:
        raise CheckpointError(f"{where}checkpoint holds a {name!r} model, "
                              f"expected {expected_model!r}")
    try:
        model = build_model(config_from_dict(name, payload["config"]))
        model.load_state_dict(payload["state_dict"])
    except (ValueError, TypeError, RuntimeError, KeyError) as exc:
        raise CheckpointError(f"{where}checkpoint does not match the {name} model: "
                              f"{error_summary(exc)}") from None
    return model.to(map_location if isinstance(map_location, (str, torch.device)) else "cpu").eval()
