"""How deep the training loop sits: frames, files and types from the console entry point
(``capsnet.cli.main.main``) to the first ``torch.optim.Optimizer.step``, by a profile hook
on a tiny run (issue 46's measure).

    python -m benchmarks.loop_depth [--data-dir DIR]

Frames: the package's frames on the stack when the first optimiser step is called, from
``main`` to the step's caller. Files: the package's files among them. Types: the package's
own classes (neither ``nn.Module`` nor model configs) whose code ran, or whose instance was
``self``, between entering ``main`` and the first step.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

import capsnet
from capsnet.config import DataConfig

PACKAGE = str(Path(capsnet.__file__).resolve().parent)
TINY_RUN = ["train", "--preset", "small", "--epochs", "1", "--subset", "64", "--val-size", "32",
            "--batch-size", "32", "--no-progress", "--device", "cpu"]


class _Stop(Exception):
    """Raised at the first optimiser step: the measure is taken, the run need not go on."""


@dataclass
class LoopDepth:
    frames: list[str]  # 'file:function' from main to the step's caller
    files: list[str]
    types: list[str]


# Functions whose optimiser steps are no training step of the run: the memory estimate's
# trace on fake tensors (capsnet.models.sizing).
NOT_THE_RUN = {"traced_peak_bytes"}


def _is_step(frame) -> bool:
    """The first real optimiser step: torch.optim.Optimizer.step, not under NOT_THE_RUN."""
    if frame.f_code.co_name != "step" or not isinstance(frame.f_locals.get("self"),
                                                        torch.optim.Optimizer):
        return False
    while frame is not None:
        if frame.f_code.co_name in NOT_THE_RUN:
            return False
        frame = frame.f_back
    return True


def _counted_type(obj) -> type | None:
    kind = obj if isinstance(obj, type) else type(obj)
    if not kind.__module__.startswith("capsnet."):
        return None
    if issubclass(kind, (nn.Module, DataConfig)):
        return None
    return kind


def measure(argv: list[str]) -> LoopDepth:
    """Run ``capsnet`` with ``argv`` until its first optimiser step, under the hook."""
    from capsnet.cli.main import main

    types: set[type] = set()
    found: list = []

    def hook(frame, event, arg):
        if event != "call":
            return
        if _is_step(frame):
            found.append(frame.f_back)
            sys.setprofile(None)
            raise _Stop
        if frame.f_code.co_filename.startswith(PACKAGE) or frame.f_code.co_filename == "<string>":
            owner = frame.f_locals.get("self", frame.f_locals.get("cls"))
            kind = _counted_type(owner) if owner is not None else None
            if kind is not None:
                types.add(kind)

    sys.setprofile(hook)
    try:
        main(argv)
    except _Stop:
        pass
    finally:
        sys.setprofile(None)
    if not found:
        raise RuntimeError("the run ended without an optimiser step")
    chain, frame = [], found[0]
    while frame is not None:
        if frame.f_code.co_filename.startswith(PACKAGE):
            chain.append(frame)
        if frame.f_code is main.__code__:
            break
        frame = frame.f_back
    chain.reverse()
    names = [f"{Path(f.f_code.co_filename).relative_to(PACKAGE)}:{f.f_code.co_name}"
             for f in chain]
    files = sorted({name.split(":")[0] for name in names})
    return LoopDepth(names, files, sorted(t.__qualname__ for t in types))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as out:
        run = [*TINY_RUN, "--out-dir", out]
        if args.data_dir:
            run += ["--data-dir", args.data_dir]
        torch.manual_seed(0)
        depth = measure(run)
    print(f"frames {len(depth.frames)}: " + " -> ".join(depth.frames))
    print(f"files {len(depth.files)}: " + ", ".join(depth.files))
    print(f"types {len(depth.types)}: " + ", ".join(depth.types))
    return 0


if __name__ == "__main__":
    sys.exit(main())
