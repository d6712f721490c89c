"""Writing self-describing checkpoints, atomically. Reading them is :mod:`capsnet.loading`."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capsnet.config import config_to_dict
from capsnet.loading import CHECKPOINT_FORMAT, CHECKPOINT_VERSION
from capsnet.models import model_name_of, unwrap


def _atomic_write(path: str | os.PathLike, write) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync, then rename it over
    ``path``, so an interrupted write never leaves a half-written file under the real name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save ``obj`` to ``path`` atomically."""
    _atomic_write(path, lambda f: torch.save(obj, f))


def atomic_copy(source: str | os.PathLike, path: str | os.PathLike) -> None:
    """Copy a written checkpoint to ``path`` atomically: the same bytes as saving the same
    state again, without serialising it a second time."""
    with open(source, "rb") as src:
        _atomic_write(path, lambda f: shutil.copyfileobj(src, f, length=1 << 24))


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
