"""Functions only the tests use: writing IDX files (fake datasets) and decoding one capsule
with one pose dimension moved (the reference of ``perturbation_grid``)."""
from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from capsnet.data.idx import GZIP_SUFFIX, TYPE_CODES

# numpy dtype (native byte order) -> IDX type code
IDX_CODES = {dtype.newbyteorder("="): code for code, dtype in TYPE_CODES.items()}


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write ``array`` as an IDX file, gzip-compressed when ``path`` ends in ``.gz``: the
    magic ``00 00 <type code> <ndim>``, big-endian uint32 sizes, the big-endian payload."""
    array = np.asarray(array)
    code = IDX_CODES[array.dtype.newbyteorder("=")]  # KeyError: no IDX type for this dtype
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    data = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    if str(path).endswith(GZIP_SUFFIX):
        data = gzip.compress(data, mtime=0)
    Path(path).write_bytes(data)


@torch.no_grad()
def perturb_capsule(model: nn.Module, poses: torch.Tensor, digit: int, dim: int,
                    delta: float) -> torch.Tensor:
    """Reconstructions (B, C, H, W) with dimension ``dim`` of capsule ``digit`` moved by
    ``delta`` in every pose set poses (B, J, D); the other capsules are masked out."""
    moved = poses.clone()  # (B, J, D)
    moved[:, digit, dim] += delta
    return model.decoder(moved, torch.full((poses.shape[0],), digit, dtype=torch.long,
                                           device=poses.device))  # (B, C, H, W)
