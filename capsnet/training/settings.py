"""Everything a training run is given, in one dataclass saved with the run, and the named
recipes (the paper's and a fast one) that fill what a run leaves None."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from capsnet.attacks.training import check_adversarial
from capsnet.models import check_options, has_option, model_entry

SCHEDULES = ("exp", "cosine")
AUGMENTATIONS = ("shift", "efficient")  # capsnet.training.loop.augment_batch


# A recipe: the training schedule a run gets when it names only the recipe, as plain values
# that fill the settings a run leaves None (RECIPE_FIELDS; ``lr_scale`` and ``max_shift`` in
# __post_init__). Its keys: epochs, batch_size; lr_scale, the peak Adam rate as a multiple
# of the model's paper rate (1e-3 for CapsNet); schedule, 'exp' (x lr_decay after each
# epoch) or 'cosine' (set every step); warmup_epochs, a linear warm-up to the peak (0: none);
# min_lr, the floor ('cosine' ends there, 'exp' never goes below it); ema_decay, the weights'
# moving average updated every step (0: none), ema_warmup (its decay ramps up as
# min(decay, (1 + n) / (10 + n))); augment, 'shift' (of up to max_shift pixels) or
# 'efficient'; val_size (None: validation_size()); margin_weight (capsnet.losses.capsule_loss);
# model_options, the CapsNet options it sets (capsnet.models.capsnet.CapsNetConfig).

# The paper's: Adam at 1e-3 decayed by 0.96 after each epoch, 2-pixel shifts, batch 128.
PAPER_RECIPE = dict(epochs=10, batch_size=128, lr_scale=1.0, schedule="exp", lr_decay=0.96,
                    warmup_epochs=0.0, min_lr=0.0, ema_decay=0.0, ema_warmup=False,
                    augment="shift", max_shift=2, val_size=None, margin_weight=1.0,
                    model_options={})

# Peak Adam 3 x the rate, one epoch of warm-up, cosine to 1e-5, EMA 0.999, chosen on
# validation only (docs/results.md, "The fast recipe: time to accuracy").
FAST_RECIPE = {**PAPER_RECIPE, "epochs": 15, "lr_scale": 3.0, "schedule": "cosine",
               "warmup_epochs": 1.0, "min_lr": 1e-5, "ema_decay": 0.999, "ema_warmup": True}

# The released code's (tensorflow/models, research/capsules: model.py and experiment.py's
# MNIST command): Adam 1e-3 x 0.96 ** (step / 2,000) (tf.train.exponential_decay, not
# staircase) floored at 1e-6, --max_steps=300000 of batch 128 on all 60,000 training images
# (no validation split unless --validate), shifts of up to 2 pixels (25 positions).
RELEASED_DECAY, RELEASED_DECAY_STEPS, RELEASED_STEPS, RELEASED_MIN_LR = 0.96, 2000, 300_000, 1e-6
MNIST_TRAIN_IMAGES, RELEASED_BATCH = 60_000, 128
RELEASED_STEPS_PER_EPOCH = math.ceil(MNIST_TRAIN_IMAGES / RELEASED_BATCH)  # 469
# Here the rate steps once an epoch, to the released curve's value at the epoch's start:
# 0.96 ** (469 / 2000) = 0.9905 an epoch, 640 epochs (300,160 steps), ending near 2.2e-6.
OFFICIAL_RECIPE = {
    **PAPER_RECIPE, "epochs": math.ceil(RELEASED_STEPS / RELEASED_STEPS_PER_EPOCH),
    "batch_size": RELEASED_BATCH,
    "lr_decay": RELEASED_DECAY ** (RELEASED_STEPS_PER_EPOCH / RELEASED_DECAY_STEPS),
    "min_lr": RELEASED_MIN_LR, "val_size": 0,
    "margin_weight": 0.5,  # layers._margin_loss: 0.5 x present + 0.5 x 0.5 x absent
    "model_options": {"routing_full_graph": True,  # the votes' gradient through every iteration
                      "routing_biases": True,  # capsule layer's `biases` (0.1) before each squash
                      "digit_weights_stddev": 0.1}}  # variables.weight_variable's stddev

# The recipes by name, as CapsNet trains under them; a model's registry entry changes them.
RECIPES = {"paper": PAPER_RECIPE, "fast": FAST_RECIPE, "official": OFFICIAL_RECIPE}


def recipe_for(name: str, model: str = "capsnet") -> dict:
    """The recipe ``name`` with ``model``'s changes; ValueError naming the choices otherwise."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")
    changes = model_entry(model).recipes.get(name, {})
    unknown = set(changes) - set(RECIPES[name])
    if unknown:
        raise ValueError(f"{model}'s {name} recipe changes unknown fields {sorted(unknown)}")
    return {**RECIPES[name], **changes}


def default_lr(model: str, preset: str) -> float:
    """The Adam rate of a run that names none: the model's paper rate for the preset."""
    return model_entry(model).lr_for(preset)


@dataclass
class TrainSettings:
    task: str = "classify"  # 'classify' (the paper's recipe), 'affnist' or 'multimnist'
    model: str = "capsnet"  # 'capsnet', 'cnn', 'efficient' or 'em'
    preset: str = "paper"  # layer sizes: 'paper' or 'small'
    dataset: str = "mnist"  # mnist, fashion-mnist, cifar10, svhn, or folder (data_dir = its root)
    data_dir: str | None = None
    download: bool = True
    # None below: the recipe's value for the model (RECIPES)
    recipe: str = "paper"  # 'paper', 'fast' or 'official' (the released code's)
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None  # peak Adam rate; None: the recipe's multiple of default_lr()
    lr_decay: float | None = None  # schedule 'exp': multiplied into the rate after each epoch
    schedule: str | None = None  # 'exp' (per epoch) or 'cosine' (per step)
    warmup_epochs: float | None = None  # linear warm-up from ~0 to lr (per step)
    min_lr: float | None = None  # the floor: 'cosine' ends there, 'exp' stops there
    ema_decay: float | None = None  # EMA of the weights, validated/saved/tested; 0: none
    ema_warmup: bool | None = None  # EMA decay min(ema_decay, (1 + n) / (10 + n)) at update n
    # Model options; None: the preset's. Checked against the model (make_config).
    routing: str | None = None  # CapsNet: the routing algorithm (capsnet.routing.ROUTERS)
    routing_iterations: int | None = None
    reconstruction_weight: float = 0.0005  # 0 trains CapsNet without its decoder
    margin_weight: float | None = None  # the margin loss's factor (the official recipe: 0.5)
    routing_full_graph: bool | None = None  # CapsNet: gradients through every iteration
    routing_biases: bool | None = None  # CapsNet: a bias on DigitCaps' s before each squash
    digit_weights_stddev: float | None = None  # CapsNet: DigitCaps' initial W (paper 0.01)
    cnn_decoder: str | None = None  # CNN: 'plain' (CNN+R) or 'class-conditional' (CNN+CR) decoder
    cnn_head: str | None = None  # CNN: 'linear' (logits) or 'capsules' (squashed, margin loss)
    augment: str | None = None  # 'shift' (max_shift) or 'efficient' (Efficient-CapsNet's)
    max_shift: int | None = None  # 'shift': random translations of up to this many pixels
    crop: int | None = None  # random crops in training (instead of shifts), centre crop to evaluate
    # adversarial training: each augmented batch replaced by attacked images of the model
    # being trained (capsnet.attacks.training: 'fgsm-rs' or 'pgd'), in the L-inf eps-ball
    adversarial: str | None = None
    adversarial_eps: float | None = None  # e.g. 0.3 on MNIST, 0.1 on Fashion-MNIST
    adversarial_steps: int = 10  # 'pgd': its steps ('fgsm-rs' takes one)
    image_size: int | None = None  # resize the images to N x N (default: their own size)
    channels: int | None = None  # 1 (grey) or 3 (RGB); default: the data's own
    input_norm: str = "auto"  # 'none', 'image', 'auto' (model_view.input_norm_for; CNN: none)
    conv1_stride: str | int = "auto"  # CapsNet: a number or 'auto' (model_view.conv1_stride_for)
    skip_bad_images: bool = False  # folders: skip unreadable files (with a warning), don't fail
    subset: int | None = None  # train on the first N images of the training pool
    val_size: int | None = None  # held out, stratified; 0 for none; None: validation_size()
    seed: int = 0
    device: str = "auto"
    precision: str = "auto"  # 'auto' (bf16 where native), 'fp32', 'bf16' or 'fp16' (autocast)
    conv_impl: str = "auto"  # 'auto' (gemm on a CPU, native elsewhere), 'native', 'channels_last'
    compile: bool = False  # torch.compile the model with its loss
    cuda_graph: bool = False  # on CUDA: capture the whole step once, replay it (loop.cuda_graphed)
    deterministic: bool = False  # cuDNN: deterministic algorithms instead of autotuning
    monitor_test: bool = False  # also evaluate the test set after every epoch (never for selection)
    target_accuracy: float | None = None  # stop after the first epoch whose validation reaches it
    canvas: int | None = None  # affNIST: side of the canvas the digits are placed on
    test_limit: int | None = None  # affNIST: test on the first N test digits only
    test_pairs: int | None = None  # MultiMNIST: test pairs made from the test digits
    time_limit: float | None = None  # seconds: stop (resumable) before an epoch would overrun
    keep_every: int | None = None  # also keep every N-th epoch's checkpoint as epoch-NNN.pt
    checkpoint_every: int = 1  # last.pt every N epochs (and the last, and before a stop)
    out_dir: str = "runs/latest"
    progress: bool = True

    def __post_init__(self) -> None:
        recipe = recipe_for(self.recipe, self.model)
        for name, value in recipe["model_options"].items():
            if getattr(self, name) is None and has_option(self.model, name):
                setattr(self, name, value)
        check_options(self.model, self.preset, **self.model_options())
        for name in RECIPE_FIELDS:
            if getattr(self, name) is None:
                setattr(self, name, recipe[name])
        if self.lr is None:
            self.lr = recipe["lr_scale"] * default_lr(self.model, self.preset)
        if self.max_shift is None:  # the 'shift' augmentation's; a run without it records 0
            self.max_shift = recipe["max_shift"] if self.augment == "shift" else 0
        self.check()

    def model_options(self) -> dict:
        """The model's config options these settings name (not left to the preset)."""
        options = {"routing": self.routing, "routing_iterations": self.routing_iterations,
                   "input_norm": None if self.input_norm == "auto" else self.input_norm,
                   "conv1_stride": None if self.conv1_stride == "auto" else int(self.conv1_stride),
                   "decoder": self.cnn_decoder, "head": self.cnn_head,
                   "routing_full_graph": self.routing_full_graph,
                   "routing_biases": self.routing_biases,
                   "digit_weights_stddev": self.digit_weights_stddev}
        return {name: value for name, value in options.items() if value is not None}

    def check(self) -> None:
        """A ValueError, naming the setting, for a value that cannot run."""
        if self.epochs < 1:
            raise ValueError(f"epochs must be at least 1, not {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {self.batch_size}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; choose from "
                             f"{', '.join(SCHEDULES)}")
        if self.warmup_epochs < 0 or self.warmup_epochs > self.epochs:
            raise ValueError(f"warmup_epochs must be within 0..epochs ({self.epochs}), "
                             f"not {self.warmup_epochs}")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1) (0: no moving average), "
                             f"not {self.ema_decay}")
        if self.augment not in AUGMENTATIONS:
            raise ValueError(f"unknown augmentation {self.augment!r}; choose from "
                             f"{', '.join(AUGMENTATIONS)}")
        if self.augment != "shift" and self.max_shift:
            raise ValueError(f"max_shift {self.max_shift} needs augment 'shift'; augment "
                             f"{self.augment!r} moves the images its own way")
        if self.augment != "shift" and self.crop is not None:
            raise ValueError(f"crop takes the place of augment 'shift'; it does not combine "
                             f"with augment {self.augment!r}")
        if self.adversarial is not None and self.task != "classify":
            raise ValueError(f"adversarial training is an option of the classification runs "
                             f"(capsnet train, repeat), not of {self.task}")
        if self.adversarial is not None:
            check_adversarial(self.adversarial, self.adversarial_eps, self.adversarial_steps)
        elif self.adversarial_eps is not None:
            raise ValueError("adversarial_eps needs adversarial ('fgsm-rs' or 'pgd')")
        if self.checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be a positive number of epochs, "
                             f"not {self.checkpoint_every}")
        if self.keep_every is not None and self.keep_every < 1:
            raise ValueError(f"keep_every must be a positive number of epochs, "
                             f"not {self.keep_every}")
        if self.cuda_graph and (self.compile or self.precision == "fp16" or self.model == "em"):
            raise ValueError("cuda_graph does not combine with compile (its reduce-overhead mode "
                             "captures graphs itself), precision fp16 (the gradient scaler reads "
                             "back) or model em (its margin schedule is read on the host)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> TrainSettings:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in values.items() if k in known}
        values.setdefault("augment", "shift")  # the only one before the setting existed
        model = values.get("model", cls.model)
        for name in SAVED_FOR_EVERY_MODEL:  # runs saved before model options were checked
            if name in values and not has_option(model, name):
                del values[name]
        return cls(**values)


# Options every run saved, whatever its model, before they were checked against it.
SAVED_FOR_EVERY_MODEL = ("routing", "routing_iterations", "input_norm", "conv1_stride")


# Settings a recipe fills when a run leaves them None (the learning rate and max_shift: see
# __post_init__).
RECIPE_FIELDS = ("epochs", "batch_size", "schedule", "lr_decay", "warmup_epochs", "min_lr",
                 "ema_decay", "ema_warmup", "augment", "val_size", "margin_weight")


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
RESUME_OVERRIDES = ("epochs", "device", "progress", "time_limit", "keep_every",
                    "checkpoint_every")


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
    from capsnet.checkpoint import load_checkpoint

    checkpoint = resume_checkpoint(resume)
    saved = load_checkpoint(checkpoint, mmap=True).get("train_settings")  # no tensors read
    settings = dataclasses.replace(given) if saved is None else TrainSettings.from_dict(saved)
    kept = set(keep)
    for name in (*(n for n in RESUME_OVERRIDES if n not in kept), *also_given):
        setattr(settings, name, getattr(given, name))
    settings.out_dir = out_dir or str(checkpoint.parent)
    return settings
