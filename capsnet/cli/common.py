"""Arguments shared by several commands, and the errors the CLI reports in one line."""
from __future__ import annotations

import argparse

from capsnet.data.idx import IDXError
from capsnet.data.sources import DATASETS, DataNotFoundError
from capsnet.training.checkpoint import CheckpointError
from capsnet.training.loop import NonFiniteLossError

# Errors shown as 'capsnet: error: <message>' with no traceback.
USER_ERRORS = (IDXError, DataNotFoundError, CheckpointError, NonFiniteLossError, FileNotFoundError,
               ValueError)


def add_data_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dataset", default="mnist", choices=sorted(DATASETS),
                        help="dataset name (default: mnist)")
    parser.add_argument("--data-dir", default=None,
                        help="directory holding the four IDX files (.gz or raw); default: "
                             "$CAPSNET_DATA_DIR, then the user cache, then download")
    parser.add_argument("--no-download", dest="download", action="store_false",
                        help="never download; fail if the files are not found")


def add_device_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto",
                        help="auto (cuda, then mps, then cpu), cpu, cuda, cuda:1, mps")
