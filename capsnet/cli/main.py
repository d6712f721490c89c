"""The `capsnet` command: one subcommand per module in capsnet.cli."""
from __future__ import annotations

import argparse
import importlib
import sys

from capsnet import __version__
from capsnet.cli.args import USER_ERRORS
from capsnet.config import ConfigError
from capsnet.devices import keep_freed_memory

# Modules under capsnet.cli, each with add_parser(subparsers) and run(args, argv) -> int.
COMMANDS = [
    "train", "evaluate", "repeat",  # training and honest evaluation
    "predict", "reconstruct", "manipulate", "routing", "plot", "serve",  # using a trained model
    "robustness", "affnist", "multimnist", "attack",  # beyond plain accuracy
    "export",  # deployment
]


USAGE_ERROR = 2  # argparse's exit status for a wrong command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="capsnet", description="Capsule Networks "
                                     "(Sabour, Frosst & Hinton 2017) on MNIST, in PyTorch.")
    parser.add_argument("--version", action="version", version=f"capsnet {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"capsnet.cli.{name}").add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    keep_freed_memory()  # every command's CPU tensors: heap reuse instead of fresh mmaps
    try:
        return args.func(args, argv)
    except ConfigError as exc:  # a model option the model does not take: a usage error
        print(f"capsnet: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except USER_ERRORS as exc:
        print(f"capsnet: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("capsnet: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
