"""Every argument shared by several commands, declared once, and the errors the CLI reports
in one line."""
from __future__ import annotations

import argparse
import sys

from torch import nn

from capsnet.attacks.training import ADVERSARIAL_KINDS
from capsnet.checkpoint import CheckpointError, load_model
from capsnet.config import INPUT_NORMS, ConfigError
from capsnet.data.datasets import DATASET_NAMES, FOLDER, load_split
from capsnet.data.folder import FolderDatasetError, format_skipped_warning
from capsnet.data.idx import IDXError
from capsnet.data.image_dataset import ImageDataset
from capsnet.data.model_view import (
    AUTO_MODEL,
    LARGE_IMAGE_SIZE,
    MANY_CLASSES,
    folder_shape,
    load_test_set,
    model_for_data,
)
from capsnet.data.sources import DataNotFoundError
from capsnet.devices import pick_device, tune_backends
from capsnet.extras import MissingExtraError
from capsnet.layers.gemm_conv import CONV_IMPLS
from capsnet.models import MODELS, has_option, preset_names
from capsnet.models.base import PRECISIONS
from capsnet.models.cnn_baseline import CNN_DECODERS, CNN_HEADS
from capsnet.routing import capsnet_routers
from capsnet.training.loop import NonFiniteLossError
from capsnet.training.settings import (
    DEFAULT_VAL_SIZE,
    RECIPES,
    SCHEDULES,
    VAL_FRACTION_INVERSE,
    TrainSettings,
    default_lr,
    recipe_for,
    resumed_settings,
)
from capsnet.tuning import MemoryExceeded, tune_for_inference

# Errors shown as 'capsnet: error: <message>' with no traceback.
USER_ERRORS = (IDXError, DataNotFoundError, CheckpointError, FolderDatasetError,
               NonFiniteLossError, MemoryExceeded, MissingExtraError, FileNotFoundError, ValueError)
DEFAULTS = TrainSettings()
# The model config options (capsnet.models) that flags set, and their flags.
MODEL_OPTION_FLAGS = {"routing": "--routing", "routing_iterations": "--routing-iterations",
                      "input_norm": "--input-norm", "conv1_stride": "--conv1-stride",
                      "decoder": "--cnn-decoder", "head": "--cnn-head"}


def add_data_args(parser: argparse.ArgumentParser, model_default: bool = False) -> None:
    """--dataset, --data-dir, --no-download; with ``model_default`` (commands that test a
    trained model) the dataset defaults to the model's own, and --skip-bad-images is there."""
    if model_default:
        parser.add_argument("--dataset", default=None, choices=sorted(DATASET_NAMES),
                            help="dataset name (default: the one the model was trained on; "
                                 "for 'folder' pass its root with --data-dir)")
    else:
        parser.add_argument("--dataset", default="mnist", choices=sorted(DATASET_NAMES),
                            help="dataset name (default: mnist)")
    parser.add_argument("--data-dir", default=None,
                        help="directory holding the dataset's files (for --dataset folder: the "
                             "root holding train/<class>/ and optionally test/<class>/); "
                             "default: $CAPSNET_DATA_DIR, then the user cache, then download")
    parser.add_argument("--no-download", dest="download", action="store_false",
                        help="never download; fail if the files are not found")
    if model_default:
        parser.add_argument("--skip-bad-images", action="store_true",
                            help="folder datasets: skip unreadable image files with a warning")


def load_cli_test_set(args: argparse.Namespace, config) -> ImageDataset:
    """The test set of --dataset (default: the model's own) as the model with ``config`` sees
    it (its channels, size and crop), on the CPU; skipped files are reported on stderr."""
    test = load_test_set(config, args.dataset, args.data_dir, args.download,
                         skip_bad=getattr(args, "skip_bad_images", False))
    warning = format_skipped_warning(test.info)
    if warning:
        print(f"capsnet: {warning}", file=sys.stderr)
    return test


def add_device_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto",
                        help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps")


def add_model_args(parser: argparse.ArgumentParser, checkpoint: str | None = "option") -> None:
    """The model to use (a checkpoint, a weights file or the shipped model) as --checkpoint
    (``checkpoint`` 'option'), as an optional positional ('positional'), or not at all (None:
    the command names its checkpoints itself); the device and the speed options."""
    help_text = ("a .pt checkpoint from `capsnet train` or a .safetensors weights file "
                 "(default: the trained model shipped with capsnet)")
    if checkpoint == "positional":
        parser.add_argument("checkpoint", nargs="?", default=None, help=help_text)
    elif checkpoint == "option":
        parser.add_argument("--checkpoint", default=None, metavar="PATH", help=help_text)
    add_device_arg(parser)
    parser.add_argument("--precision", default="auto", choices=["auto", *PRECISIONS],
                        help="auto: bf16 autocast where the device computes bf16 natively "
                             "(CPUs with AVX512-BF16 or AMX, GPUs of compute capability 8.0 "
                             "on), else fp32; fp16 trains with gradient scaling (routing, "
                             "squash and losses stay float32)")
    parser.add_argument("--conv-impl", default="auto", choices=["auto", *CONV_IMPLS],
                        help="convolution path: auto (gemm on a CPU, native elsewhere), gemm "
                             "(per-kernel-row matrix products, CPU), native (oneDNN/cuDNN, "
                             "NCHW) or channels_last")
    parser.add_argument("--deterministic", action="store_true",
                        help="GPUs: deterministic cuDNN algorithms instead of autotuned ones "
                             "(reproducible to the bit on one GPU, slower)")


def load_cli_model(args: argparse.Namespace, source: str | None = None) -> nn.Module:
    """The model named by --checkpoint (or ``source``, or the shipped one) on the --device,
    in eval mode, running as --precision and --conv-impl say."""
    device = pick_device(args.device)
    tune_backends(device, deterministic=args.deterministic)  # as training ran: no TF32 matmuls
    model = load_model(source if source is not None else args.checkpoint, device)
    tune_for_inference(model, next(model.parameters()).device, args.precision, args.conv_impl)
    return model


def add_recipe_args(p: argparse.ArgumentParser, models: tuple[str, ...] | None = None) -> None:
    """Model, data and optimisation options of every training command (``models``: the
    --model choices, default every registered one); only the model options given are checked."""
    choices = list(models or MODELS)
    if models is None:  # train and repeat: the model the data calls for
        choices.append(AUTO_MODEL)
    p.add_argument("--model", default=None if models is None else models[0], choices=choices,
                   help="; ".join(f"{name}: {MODELS[name].summary}" for name in choices
                                  if name in MODELS)
                   + ("; auto: the model the data's size and classes call for (capshead from "
                      f"{LARGE_IMAGE_SIZE} px or {MANY_CLASSES} classes, else capsnet), as "
                      "create_model('auto'); the default for --dataset folder, else capsnet"
                      if models is None else ""))
    p.add_argument("--preset", default=DEFAULTS.preset, choices=preset_names(),
                   help="layer sizes: 'paper', 'half' (half the paper's channels: the affNIST "
                        "CNN at about the paper CNN's parameter count), the narrow 'small' for "
                        "quick CPU runs, or the paper's section 7 models 'cifar10' (64 primary "
                        "types, a none-of-the-above routing category, 24x24 crops) and 'svhn'")
    add_data_args(p)
    add_schedule_args(p)
    p.add_argument("--routing", default=None, choices=capsnet_routers(),
                   help="CapsNet: how primary capsules are routed to the class capsules: "
                        "'dynamic' (the paper's routing by agreement, the default), "
                        "'inverted-attention' (Tsai et al. 2020) or 'self-attention' "
                        "(Efficient-CapsNet's, Mazzia et al. 2021); see docs/models.md")
    p.add_argument("--routing-iterations", type=int, default=None,
                   help="CapsNet with an iterative router, and EM (default: 3)")
    p.add_argument("--reconstruction-weight", type=float, default=DEFAULTS.reconstruction_weight,
                   help="0 trains CapsNet without the decoder")
    p.add_argument("--adversarial", default=None, choices=ADVERSARIAL_KINDS,
                   help="adversarial training: each batch replaced by the model's own attacked "
                        "images, 'fgsm-rs' (fast adversarial training, FGSM from a random "
                        "start) or 'pgd' (--adversarial-steps steps); needs --adversarial-eps")
    p.add_argument("--adversarial-eps", type=float, default=None,
                   help="--adversarial: the L-inf radius (e.g. 0.3 on MNIST, 0.1 on "
                        "Fashion-MNIST)")
    p.add_argument("--adversarial-steps", type=int, default=None,
                   help="--adversarial pgd: steps of the attack (default 10)")
    p.add_argument("--cnn-decoder", default=DEFAULTS.cnn_decoder, choices=CNN_DECODERS,
                   help="--model cnn: a reconstruction decoder fed the last hidden layer, "
                        "'plain' (CNN+R) or 'class-conditional' (CNN+CR; Qin et al. 2020)")
    p.add_argument("--cnn-head", default=DEFAULTS.cnn_head, choices=CNN_HEADS,
                   help="--model cnn: 'linear' (logits, cross-entropy; the default) or "
                        "'capsules' (one squashed 16-D vector a class, its length the score, "
                        "the margin loss)")
    add_image_args(p)
    p.add_argument("--subset", type=int, default=None,
                   help="train on the first N images of the training pool")
    p.add_argument("--val-size", type=int, default=None,
                   help=f"validation images held out of the training set (0: train on all; "
                        f"default: {DEFAULT_VAL_SIZE}, or a tenth of a training pool smaller "
                        f"than {DEFAULT_VAL_SIZE * VAL_FRACTION_INVERSE})")
    p.add_argument("--seed", type=int, default=DEFAULTS.seed)
    add_model_args(p, checkpoint=None)
    p.add_argument("--compile", action="store_true", help="torch.compile the model with its loss")
    p.add_argument("--cuda-graph", action="store_true",
                   help="on a CUDA GPU, capture the whole training step (forward, loss, "
                        "backward, Adam, EMA) once as a CUDA graph and replay it; elsewhere "
                        "the same step runs as it is")
    p.add_argument("--no-progress", dest="progress", action="store_false")


def add_schedule_args(p: argparse.ArgumentParser) -> None:
    """--recipe and the options it fills when they are not given: epochs, batch, the
    learning rate's peak and schedule, the weights' moving average."""
    paper, fast, efficient = RECIPES["paper"], RECIPES["fast"], recipe_for("paper", "efficient")
    efficient_fast, em_fast = recipe_for("fast", "efficient"), recipe_for("fast", "em")
    rates = {name: default_lr(name, "paper") for name in MODELS}
    p.add_argument("--recipe", default=None, choices=list(RECIPES),
                   help=f"training schedule filling every option below left unset: 'paper' "
                        f"(default: {paper['epochs']} epochs, Adam x {paper['lr_decay']} after "
                        f"each epoch; for --model efficient its authors': {efficient['epochs']} "
                        f"epochs, batch {efficient['batch_size']}, x {efficient['lr_decay']} down "
                        f"to {efficient['min_lr']:g}, --augment {efficient['augment']}) or "
                        f"'fast' ({fast['epochs']} epochs, peak {fast['lr_scale']:g}x the model's "
                        f"rate, {fast['warmup_epochs']:g} epoch warm-up, {fast['schedule']} to "
                        f"{fast['min_lr']:g}, EMA {fast['ema_decay']:g} of the weights; for "
                        f"--model efficient {efficient_fast['epochs']} epochs of --augment "
                        f"{efficient_fast['augment']}; for --model em its own rate as "
                        f"the peak ({em_fast['lr_scale']:g}x))")
    p.add_argument("--epochs", type=int, default=None, help="default: the recipe's")
    p.add_argument("--batch-size", type=int, default=None,
                   help=f"global batch (split over the processes under torchrun; default: "
                        f"the recipe's, {paper['batch_size']}; {efficient['batch_size']} for "
                        f"Efficient-CapsNet's paper recipe)")
    p.add_argument("--lr", type=float, default=None,
                   help=f"peak Adam learning rate (default: the recipe's multiple of "
                        f"{rates['capsnet']}; of {rates['cnn']} for the CNN baseline but its "
                        f"small and tiny presets, which dies at {rates['capsnet']}; of "
                        f"{rates['efficient']} for Efficient-CapsNet; of {rates['em']} for EM)")
    p.add_argument("--lr-decay", type=float, default=None,
                   help=f"schedule exp: learning-rate factor applied after each epoch (default: "
                        f"the recipe's, {paper['lr_decay']}; {efficient['lr_decay']} for "
                        f"Efficient-CapsNet's paper recipe; with --resume: the run's own unless "
                        f"given)")
    p.add_argument("--schedule", default=None, choices=SCHEDULES,
                   help="learning rate: exp (x --lr-decay after each epoch, the paper's) or "
                        "cosine (down to --min-lr at the last step, set every step)")
    p.add_argument("--warmup-epochs", type=float, default=None, metavar="F",
                   help="linear warm-up to the peak rate over F epochs, set every step")
    p.add_argument("--min-lr", type=float, default=None,
                   help=f"the rate's floor: cosine ends there, exp stops decaying "
                        f"there (default: the recipe's; {paper['min_lr']:g} in the paper recipe, "
                        f"{efficient['min_lr']:g} in Efficient-CapsNet's)")
    p.add_argument("--ema-decay", type=float, default=None, metavar="F",
                   help="exponential moving average of the weights, updated every step; the "
                        "average is validated, selected, saved as the model and tested "
                        "(0: none, the paper's)")
    p.add_argument("--ema-warmup", default=None, action=argparse.BooleanOptionalAction,
                   help="the average's decay ramps up as min(F, (1 + n) / (10 + n)) over "
                        "its first updates (the fast recipe's)")


def conv1_stride_arg(text: str) -> str | int:
    """--conv1-stride: 'auto' or a positive whole number."""
    if text == "auto":
        return text
    if not text.isdecimal() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a whole number >= 1, not {text!r}")
    return int(text)


def add_image_args(p: argparse.ArgumentParser) -> None:
    """How the training images are shaped: size, channels, crops, unreadable files."""
    p.add_argument("--image-size", type=int, default=None, metavar="N",
                   help="resize every image to N x N (default: the images' own size, which must "
                        "then be the same for all)")
    p.add_argument("--channels", type=int, default=None, choices=(1, 3),
                   help="1 (grey) or 3 (RGB); default: grey if every image is grey, else RGB")
    p.add_argument("--crop", type=int, default=None, metavar="N",
                   help="train on random N x N crops (instead of shifts), evaluate the centre "
                        "crop (the cifar10 preset crops 24x24)")
    p.add_argument("--input-norm", default="auto", choices=("auto", *INPUT_NORMS),
                   help="CapsNet and CNN: how images meet Conv1: 'none' (the paper's pixels), "
                        "'image' (each image standardised), 'auto' (CapsNet: none for MNIST, "
                        "image for every other dataset; CNN: none)")
    p.add_argument("--conv1-stride", default="auto", type=conv1_stride_arg,
                   help="CapsNet: Conv1's stride: a number, or 'auto' (1 for MNIST and "
                        "images up to 32x32; larger images of other data take the smallest "
                        "stride leaving at most twice the paper's 6x6 primary grid: 2 at "
                        "48x48, 3 at 64x64)")
    p.add_argument("--skip-bad-images", action="store_true",
                   help="folder datasets: skip unreadable image files with a warning listing "
                        "them, instead of stopping at the first")


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line (``prog: error: ...``, naming the valid
    choices of a bad one) without the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_run_args(p: argparse.ArgumentParser, out_dir: str) -> None:
    """Where a run goes, and --resume."""
    p.add_argument("--out-dir", default=None,
                   help=f"run directory (default: {out_dir}; with --resume: the directory of "
                        "the resumed checkpoint)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR_OR_CHECKPOINT",
                   help="continue a stopped run (its settings are reused; --epochs may extend "
                        "it (a per-step schedule then stays at its end value) and --lr-decay "
                        "may change the exp decay from the next epoch on)")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="stop before an epoch would end after SECONDS (checkpointed: continue "
                        "with --resume), e.g. inside a job's time limit")
    p.add_argument("--keep-every", type=int, default=None, metavar="N",
                   help="also keep the checkpoint of every N-th epoch as epoch-NNN.pt in the "
                        "run directory, e.g. to compare models at a matched validation "
                        "accuracy later (metrics.csv lists each epoch's)")
    p.add_argument("--checkpoint-every", type=int, default=1, metavar="N",
                   help="write last.pt every N epochs (and after the last and before a stop; "
                        "best.pt whenever validation improves); a resume goes on from it")
    p.set_defaults(default_out_dir=out_dir)


def check_model_flags(args: argparse.Namespace) -> None:
    """ConfigError naming the flag, not the config key, of a model option --model lacks."""
    for option, flag in MODEL_OPTION_FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value not in (None, "auto") and not has_option(args.model, option):
            takers = [name for name in MODELS if has_option(name, option)]
            raise ConfigError(f"{flag} is not an option of --model {args.model} (only of "
                              f"--model {', '.join(takers)})")


def model_for_run(args: argparse.Namespace) -> str:
    """--model as given; 'auto' (the default for a folder, else 'capsnet') resolved from the
    training images' size and classes by :func:`capsnet.data.model_view.model_for_data` (a
    folder's from its listing and one image's header: training decodes it once)."""
    if args.model not in (None, AUTO_MODEL):
        return args.model
    if args.model is None and args.dataset != FOLDER:
        return DEFAULTS.model
    if args.dataset == FOLDER:
        if args.data_dir is None:  # training says what is missing
            return DEFAULTS.model
        size, classes = folder_shape(args.data_dir, args.image_size)  # nothing decoded
    else:
        train = load_split(args.dataset, "train", args.data_dir, args.download)
        size, classes = args.image_size or train.image_size[0], len(train.classes)
    model = model_for_data(size, classes)
    print(f"--model auto: {model} for {size}x{size} images of {classes} classes")
    return model


def settings_from_args(args: argparse.Namespace, **fixed) -> TrainSettings:
    """The run's settings: those given on the command line (``fixed`` values override them;
    options left at None take the dataclass default), or with --resume the stopped run's own
    settings with --device, --no-progress and, when given, --epochs and --lr-decay."""
    if not getattr(args, "resume", None):
        args.model = model_for_run(args)
    check_model_flags(args)
    values = {k: v for k, v in vars(args).items()
              if k in TrainSettings.__dataclass_fields__ and v is not None}
    given = TrainSettings(**{**values, **fixed})
    if getattr(args, "resume", None):
        also = ["lr_decay"] if args.lr_decay is not None else []
        keep = [] if args.epochs is not None else ["epochs"]
        return resumed_settings(args.resume, given, also, args.out_dir, keep=keep)
    out_dir = args.out_dir or getattr(args, "default_out_dir", None)
    if out_dir:
        given.out_dir = out_dir
    return given
