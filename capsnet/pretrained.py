"""Models by one name, as timm names them, fresh or with trained weights.

    >>> model = create_model("em-small", routing_iterations=2)  # fresh, options checked
    >>> model = create_model("capsnet", pretrained=True)  # trained: load_pretrained("capsnet")

A name is a registered model (the paper's sizes) or MODEL-PRESET ('capsnet-small'). Trained
weights are one table row per model: a safetensors file (carrying its model's name and
config), SHA-256-verified, read from the package (``capsnet/weights/``) or the user cache
(``<cache dir>/weights``); nothing is downloaded."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from capsnet.checkpoint import WEIGHTS_DIR, load_model
from capsnet.config import ConfigError, DataConfig
from capsnet.data.model_view import conv1_stride_for, resolve_model
from capsnet.data.sources import default_cache_dir, file_digest
from capsnet.models import MODELS, PAPER, build_model, make_config
from capsnet.models.sizing import check_fits

CACHE_SUBDIR = "weights"


@dataclass(frozen=True)
class Pretrained:
    """One set of trained weights: file, SHA-256, test accuracy on ``dataset`` (None: not
    measured) and how it was trained."""

    file: str
    sha256: str
    test_accuracy: float | None
    dataset: str
    command: str


# Adding trained weights is one row: name (as create_model takes it) -> Pretrained.
PRETRAINED: dict[str, Pretrained] = {
    "capsnet": Pretrained(
        "capsnet-mnist.safetensors",
        "7d6fd11a44de6068cca32832fb7ad1adfcefc0a342a499be48e15b54472f025d", 0.9967, "mnist",
        "capsnet train --epochs 12 --out-dir runs/paper-cpu && capsnet train --resume "
        "runs/paper-cpu --epochs 28 --lr-decay 0.85 && capsnet export runs/paper-cpu/last.pt "
        "--format safetensors"),
    "efficient": Pretrained(
        "efficient-mnist.safetensors",
        "74f405f0920fd988e146fc72cca578716d277a44c42f6f829976005596803825", 0.9958, "mnist",
        "capsnet train --model efficient --recipe fast --seed 1 --precision bf16 --compile "
        "--out-dir runs/efficient (planned for 25 epochs; after epoch 6 re-planned with "
        "capsnet train --resume runs/efficient --epochs 15) && capsnet export "
        "runs/efficient/best.pt --format safetensors"),
    "em-small": Pretrained(
        "em-small-mnist.safetensors",
        "9810ddd1e20ea529acf434ac8ad1968efa54ed50da68adc68a4532bb007e7c1c", 0.9811, "mnist",
        "capsnet train --model em --preset small --routing-iterations 2 --recipe fast --seed 0 "
        "--compile --precision bf16 --conv-impl gemm --out-dir runs/em (planned for 10 epochs; "
        "re-planned with --resume runs/em --epochs 6 after epoch 1 and --epochs 5 after epoch "
        "2) && capsnet export runs/em/best.pt --format safetensors"),
}


class PretrainedError(ValueError):
    """Pretrained weights that cannot be used (one line naming the file and what to do)."""


def pretrained_names() -> list[str]:
    """The names :func:`load_pretrained` takes, sorted."""
    return sorted(PRETRAINED)


def cache_dir() -> Path:
    """Where weights not shipped with the package are looked for."""
    return default_cache_dir() / CACHE_SUBDIR


def weights_path(name: str) -> Path:
    """``name``'s weights file: in the package, else in :func:`cache_dir` (else the package's)."""
    if name not in PRETRAINED:
        raise PretrainedError(f"no pretrained weights named {name!r}; choose from "
                              f"{', '.join(pretrained_names())}")
    entry = PRETRAINED[name]
    for folder in (WEIGHTS_DIR, cache_dir()):
        if (folder / entry.file).is_file():
            return folder / entry.file
    return WEIGHTS_DIR / entry.file


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    return file_digest(path, "sha256", decompress=False)


def load_pretrained(name: str, device: str = "cpu") -> nn.Module:
    """The trained model ``name`` (:func:`pretrained_names`) in eval mode on ``device``, its
    file's SHA-256 checked first; PretrainedError otherwise."""
    path = weights_path(name)
    entry = PRETRAINED[name]
    if not path.is_file():
        raise PretrainedError(f"{entry.file}: the {name!r} weights are neither in the package "
                              f"({WEIGHTS_DIR}) nor in {cache_dir()}; put the file there "
                              f"(or reinstall capsnet)")
    found = file_sha256(path)
    if found != entry.sha256:
        raise PretrainedError(f"{path}: SHA-256 {found[:12]}... is not the expected "
                              f"{entry.sha256[:12]}...; the file is damaged or another "
                              f"model's: replace it with the {name!r} weights (or reinstall)")
    return load_model(path, device)


def list_models(pretrained: bool | None = None) -> list[str]:
    """The names :func:`create_model` takes (with ``pretrained``: those with trained weights)."""
    if pretrained:
        return pretrained_names()
    return sorted(name if preset == PAPER else f"{name}-{preset}"
                  for name, entry in MODELS.items() for preset in entry.presets)


def create_model(name: str, pretrained: bool = False, **overrides) -> nn.Module:
    """A model by :func:`list_models` name: fresh with checked config ``overrides``, or trained.
    'auto' picks the model own data of that ``image_size`` and ``num_classes`` gets (as
    ``capsnet train --model auto``); a model whose weights cannot fit this machine's memory
    is one ConfigError line with the estimate, before anything is allocated."""
    if pretrained:
        if overrides:
            raise ConfigError(f"a pretrained model takes no config overrides "
                              f"(given: {', '.join(overrides)})")
        return load_pretrained(name)
    model, _, preset = name.partition("-")  # 'em-small' -> ('em', 'small')
    preset = preset or PAPER
    model = resolve_model(model, overrides.get("image_size", DataConfig.image_size),
                          overrides.get("num_classes", DataConfig.num_classes))
    if model not in MODELS or preset not in MODELS[model].presets:
        raise ConfigError(f"unknown model name {name!r}; choose from {', '.join(list_models())}")
    config = make_config(model, preset, **overrides)
    if model == "capsnet" and "conv1_stride" not in overrides:
        # as `capsnet train`: the data decides (own data: a stride that keeps the grid small)
        config = dataclasses.replace(config, conv1_stride=conv1_stride_for(config, config.dataset))
    check_fits(config, model)
    return build_model(config)
