"""The --checkpoint and --device arguments of the commands that use a trained model."""
from __future__ import annotations

import argparse

from torch import nn

import sys

from capsnet.cli.common import add_device_arg, add_speed_args
from capsnet.devices import pick_device
from capsnet.inference import resolve_model
from capsnet.tuning import tune_for_inference


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", default=None, metavar="PATH",
                        help="a .pt checkpoint from `capsnet train` or a .safetensors weights "
                             "file (default: the trained model shipped with capsnet)")
    add_device_arg(parser)
    add_speed_args(parser)


def load_cli_model(args: argparse.Namespace) -> nn.Module:
    """The model named by --checkpoint (or the shipped one) on the --device, in eval mode,
    running as --precision and --conv-impl say (measured on this machine by default)."""
    return for_inference(resolve_model(args.checkpoint, pick_device(args.device)), args)


def for_inference(model: nn.Module, args: argparse.Namespace) -> nn.Module:
    """``model`` with the inference plan of --precision/--conv-impl applied. A measurement
    (once per machine; cached) is reported on stderr, away from JSON output."""
    device = next(model.parameters()).device
    plan = tune_for_inference(model, device, args.precision, args.conv_impl)
    if plan.source == "measured":
        print(f"capsnet: inference speed plan: {plan.describe()}", file=sys.stderr)
    return model
