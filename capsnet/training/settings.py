"""Everything a training run is given, in one dataclass saved with the run."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from capsnet.training.recipes import SCHEDULES, get_recipe


@dataclass
class TrainSettings:
    task: str = "classify"  # 'classify' (the paper's recipe), 'affnist' or 'multimnist'
    model: str = "capsnet"  # 'capsnet', 'cnn', 'efficient' or 'em'
    preset: str = "paper"  # layer sizes: 'paper' or 'small'
    dataset: str = "mnist"  # mnist, fashion-mnist, cifar10, svhn, or folder (data_dir = its root)
    data_dir: str | None = None
    download: bool = True
    # None below: the recipe's value (capsnet/training/recipes.py)
    recipe: str = "paper"  # 'paper' or 'fast'
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None  # peak Adam rate; None: the recipe's multiple of default_lr()
    lr_decay: float = 0.96  # schedule 'exp': multiplied into the learning rate after each epoch
    schedule: str | None = None  # 'exp' (per epoch), 'cosine' or 'onecycle' (per step)
    warmup_epochs: float | None = None  # linear warm-up from ~0 to lr (per step)
    min_lr: float | None = None  # 'cosine'/'onecycle': the rate at the end of the run
    ema_decay: float | None = None  # EMA of the weights, validated/saved/tested; 0: none
    ema_warmup: bool | None = None  # EMA decay min(ema_decay, (1 + n) / (10 + n)) at update n
    routing: str = "dynamic"  # CapsNet: the routing algorithm (capsnet.layers.router.ROUTERS)
    routing_iterations: int = 3
    reconstruction_weight: float = 0.0005  # 0 trains CapsNet without its decoder
    max_shift: int | None = None  # random translation augmentation, pixels
    crop: int | None = None  # random crops in training (instead of shifts), centre crop to evaluate
    image_size: int | None = None  # resize the images to N x N (default: their own size)
    channels: int | None = None  # 1 (grey) or 3 (RGB); default: the data's own
    input_norm: str = "auto"  # CapsNet: 'none', 'image' or 'auto' (config.input_norm_for)
    conv1_stride: str | int = "auto"  # CapsNet: 'auto' (config.conv1_stride_for) or a number
    skip_bad_images: bool = False  # folders: skip unreadable files (with a warning), don't fail
    subset: int | None = None  # train on the first N images of the training pool
    val_size: int | None = None  # held out, stratified; 0 for none; None: validation_size()
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
        recipe = get_recipe(self.recipe)
        for name in RECIPE_FIELDS:
            if getattr(self, name) is None:
                setattr(self, name, getattr(recipe, name))
        if self.lr is None:
            self.lr = recipe.lr_scale * default_lr(self.model, self.preset)
        check_schedule(self)
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
# The 'small' and 'tiny' CNNs (6,272 and 1,568 inputs) learn at 1e-3.
PAPER_LR = 1e-3
CNN_LR = 1e-4
# Efficient-CapsNet's own Adam rate: "lr": 5e-4 in the public code's config.json
# (EscVM/Efficient-CapsNet), which also decays it by "lr_dec": 0.97 per epoch down to a
# floor of 5e-5 (utils/tools.py, learn_scheduler) at batch 16 for 150 epochs, with
# "lmd_gen": 0.392 on Keras' per-pixel mean squared error, i.e. 0.392 / 784 = 0.0005 on the
# sum, the reconstruction weight capsnet already uses (docs/models-efficient.md).
EFFICIENT_LR = 5e-4
EFFICIENT_LR_DECAY = 0.97
EFFICIENT_BATCH_SIZE = 16
EFFICIENT_EPOCHS = 150
# Matrix capsules with EM routing: Adam at 3e-3, the authors' answer on OpenReview ("We use
# an exponential decay with learning rate: 3e-3, decay_steps: 20000, decay rate: 0.96",
# https://openreview.net/forum?id=HJWLfGWRb, quoted in IBM/matrix-capsules-with-em-routing
# train_val.py, whose config.py uses it too).
EM_LR = 3e-3


def default_lr(model: str, preset: str) -> float:
    """The Adam learning rate of a run that names none: the paper's, but CNN_LR for the
    wide CNN baselines, Efficient-CapsNet's own for it and EM_LR for matrix capsules."""
    if model == "efficient":
        return EFFICIENT_LR
    if model == "em":
        return EM_LR
    return CNN_LR if model == "cnn" and preset not in ("small", "tiny") else PAPER_LR


# Settings a recipe fills when a run leaves them None (the learning rate: see __post_init__).
RECIPE_FIELDS = ("epochs", "batch_size", "schedule", "warmup_epochs", "min_lr", "ema_decay",
                 "ema_warmup", "max_shift")


def check_schedule(s: TrainSettings) -> None:
    """A ValueError for a schedule or moving average that cannot run."""
    if s.schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {s.schedule!r}; choose from {', '.join(SCHEDULES)}")
    if s.warmup_epochs < 0 or s.warmup_epochs > s.epochs:
        raise ValueError(f"warmup_epochs must be within 0..epochs ({s.epochs}), "
                         f"not {s.warmup_epochs}")
    if not 0.0 <= s.ema_decay < 1.0:
        raise ValueError(f"ema_decay must be in [0, 1) (0: no moving average), not {s.ema_decay}")


# The validation split when none is asked for: DEFAULT_VAL_SIZE images (MNIST's 5,000 of
# 60,000), or a tenth of a smaller training pool (own data of a few thousand images).
DEFAULT_VAL_SIZE = 5000
VAL_FRACTION_INVERSE = 10


def validation_size(requested: int | None, pool: int) -> int:
    """Validation images to hold out of a training pool of ``pool`` images."""
    if requested is not None:
        return requested
    return min(DEFAULT_VAL_SIZE, pool // VAL_FRACTION_INVERSE)


# Always taken from the command that resumes a run; the rest are the run's own settings.
RESUME_OVERRIDES = ("epochs", "device", "progress", "time_limit", "keep_every")


def resume_checkpoint(path: str | Path) -> Path:
    """A run directory or checkpoint file -> the checkpoint to resume from."""
    path = Path(path)
    return path / "last.pt" if path.is_dir() else path


def resumed_settings(resume: str | Path, given: TrainSettings,
                     also_given: Iterable[str] = (), out_dir: str | None = None,
                     keep: Iterable[str] = ()) -> TrainSettings:
    """The stopped run's own settings, with RESUME_OVERRIDES (but those named in ``keep``,
    e.g. 'epochs' when the command gave none) and the fields named in ``also_given`` (e.g.
    'lr_decay', to anneal faster from the next epoch on) taken from ``given``. The run goes
    on in ``out_dir`` if given, else in the resumed checkpoint's directory (the saved
    out_dir may be relative to another working directory)."""
    from capsnet.loading import load_checkpoint

    checkpoint = resume_checkpoint(resume)
    saved = load_checkpoint(checkpoint, mmap=True).get("train_settings")  # no tensors read
    settings = dataclasses.replace(given) if saved is None else TrainSettings.from_dict(saved)
    kept = set(keep)
    for name in (*(n for n in RESUME_OVERRIDES if n not in kept), *also_given):
        setattr(settings, name, getattr(given, name))
    settings.out_dir = out_dir or str(checkpoint.parent)
    return settings
