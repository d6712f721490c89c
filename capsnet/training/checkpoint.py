"""Writing self-describing checkpoints, atomically. Reading them is :mod:`capsnet.loading`."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capsnet.config import config_to_dict
from capsnet.loading import CHECKPOINT_FORMAT, CHECKPOINT_VERSION
from capsnet.models import model_name_of, unwrap


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
