"""Everything a training run is given, in one dataclass saved with the run."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass
class TrainSettings:
    task: str = "classify"  # 'classify' (the paper's recipe), 'affnist' or 'multimnist'
    model: str = "capsnet"  # 'capsnet' or 'cnn'
    preset: str = "paper"  # layer sizes: 'paper' or 'small'
    dataset: str = "mnist"  # mnist, fashion-mnist, cifar10, svhn, or folder (data_dir = its root)
    data_dir: str | None = None
    download: bool = True
    epochs: int = 10
    batch_size: int = 128
    lr: float | None = None  # Adam; None: default_lr(model, preset)
    lr_decay: float = 0.96  # multiplied into the learning rate after each epoch
    routing_iterations: int = 3
    reconstruction_weight: float = 0.0005  # 0 trains CapsNet without its decoder
    max_shift: int = 2  # random translation augmentation, pixels
    crop: int | None = None  # random crops in training (instead of shifts), centre crop to evaluate
    image_size: int | None = None  # resize the images to N x N (default: their own size)
    channels: int | None = None  # 1 (grey) or 3 (RGB); default: the data's own
    skip_bad_images: bool = False  # folders: skip unreadable files (with a warning), don't fail
    subset: int | None = None  # train on the first N images of the training pool
    val_size: int = 5000  # held out of the training set, stratified; 0 for none
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"  # 'auto' (measured), 'fp32' or 'bf16' (autocast; routing in float32)
    conv_impl: str = "auto"  # 'auto' (measured), 'gemm', 'native' or 'channels_last'
    compile: bool = False  # torch.compile the model
    deterministic: bool = False  # cuDNN: deterministic algorithms instead of autotuning
    monitor_test: bool = False  # also evaluate the test set after every epoch (never for selection)
    target_accuracy: float | None = None  # stop after the first epoch whose validation reaches it
    canvas: int | None = None  # affNIST: side of the canvas the digits are placed on
    test_limit: int | None = None  # affNIST: test on the first N test digits only
    test_pairs: int | None = None  # MultiMNIST: test pairs made from the test digits
    time_limit: float | None = None  # seconds: stop (resumable) before an epoch would overrun
    keep_every: int | None = None  # also keep every N-th epoch's checkpoint as epoch-NNN.pt
    out_dir: str = "runs/latest"
    progress: bool = True

    def __post_init__(self) -> None:
        if self.lr is None:
            self.lr = default_lr(self.model, self.preset)
        if self.keep_every is not None and self.keep_every < 1:
            raise ValueError(f"keep_every must be a positive number of epochs, "
                             f"not {self.keep_every}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> TrainSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


# The wide CNN baselines do not learn at the paper's Adam 1e-3: the 'half' CNN on the
# affNIST canvas (102,400 inputs to its first FC layer; the paper-width CNN has 100,352 at
# 28x28) ended its first epoch at loss 2.303 = ln 10, chance accuracy; at 1e-4 it learns.
# The 'small' CNN (6,272 inputs) learns at 1e-3.
PAPER_LR = 1e-3
CNN_LR = 1e-4


def default_lr(model: str, preset: str) -> float:
    """The Adam learning rate of a run that names none: the paper's, but CNN_LR for the
    wide CNN baselines."""
    return CNN_LR if model == "cnn" and preset != "small" else PAPER_LR


# Always taken from the command that resumes a run; the rest are the run's own settings.
RESUME_OVERRIDES = ("epochs", "device", "progress", "time_limit", "keep_every")


def resume_checkpoint(path: str | Path) -> Path:
    """A run directory or checkpoint file -> the checkpoint to resume from."""
    path = Path(path)
    return path / "last.pt" if path.is_dir() else path


def resumed_settings(resume: str | Path, given: TrainSettings,
                     also_given: Iterable[str] = (), out_dir: str | None = None) -> TrainSettings:
    """The stopped run's own settings, with RESUME_OVERRIDES and the fields named in
    ``also_given`` (e.g. 'lr_decay', to anneal faster from the next epoch on) taken from
    ``given``. The run goes on in ``out_dir`` if given, else in the resumed checkpoint's
    directory (the saved out_dir may be relative to another working directory)."""
    from capsnet.loading import load_checkpoint

    checkpoint = resume_checkpoint(resume)
    saved = load_checkpoint(checkpoint, mmap=True).get("train_settings")  # no tensors read
    settings = dataclasses.replace(given) if saved is None else TrainSettings.from_dict(saved)
    for name in (*RESUME_OVERRIDES, *also_given):
        setattr(settings, name, getattr(given, name))
    settings.out_dir = out_dir or str(checkpoint.parent)
    return settings
