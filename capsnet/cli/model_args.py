"""The --checkpoint and --device arguments of the commands that use a trained model."""
from __future__ import annotations

import argparse

from torch import nn

from capsnet.cli.common import add_device_arg
from capsnet.devices import pick_device
from capsnet.inference import resolve_model


def add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", default=None, metavar="PATH",
                        help="a .pt checkpoint from `capsnet train` or a .safetensors weights "
                             "file (default: the trained model shipped with capsnet)")
    add_device_arg(parser)


def load_cli_model(args: argparse.Namespace) -> nn.Module:
    """The model named by --checkpoint (or the shipped one) on the --device, in eval mode."""
    return resolve_model(args.checkpoint, pick_device(args.device))
