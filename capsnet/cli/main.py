"""The `capsnet` command: its subcommands, each an add_<name>(subparsers) in capsnet.cli
whose parser sets ``func``, a run(args, argv) -> int."""
from __future__ import annotations

import argparse
import sys

from capsnet import __version__
from capsnet.cli import attack, deploy, experiments, pictures, predict, training
from capsnet.cli.args import USER_ERRORS, OneLineParser
from capsnet.config import ConfigError
from capsnet.devices import keep_freed_memory

COMMANDS = [
    training.add_train, training.add_evaluate, training.add_repeat,  # training, evaluation
    predict.add_predict, pictures.add_reconstruct, pictures.add_manipulate,  # a trained model
    pictures.add_routing, pictures.add_plot, deploy.add_serve,
    experiments.add_robustness, experiments.add_affnist, experiments.add_multimnist,
    attack.add_attack,  # beyond plain accuracy
    deploy.add_export,  # deployment
]
USAGE_ERROR = 2  # argparse's exit status for a wrong command line


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="capsnet", description="Capsule Networks "
                                     "(Sabour, Frosst & Hinton 2017) on MNIST, in PyTorch.")
    parser.add_argument("--version", action="version", version=f"capsnet {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add_command in COMMANDS:
        add_command(subparsers)
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
