"""Arguments shared by several commands, and the errors the CLI reports in one line."""
from __future__ import annotations

import argparse

from capsnet.data.idx import IDXError
from capsnet.layers.gemm_conv import CONV_IMPLS
from capsnet.models.precision import PRECISIONS
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


def add_speed_args(parser: argparse.ArgumentParser) -> None:
    """--precision and --conv-impl: measured on this machine unless forced."""
    parser.add_argument("--precision", default="auto", choices=["auto", *PRECISIONS],
                        help="auto: bf16 autocast where the device computes bf16 natively and "
                             "measurably faster, else fp32 (routing, squash and losses stay "
                             "float32)")
    parser.add_argument("--conv-impl", default="auto", choices=["auto", *CONV_IMPLS],
                        help="convolution path: auto (the fastest measured on this machine, "
                             "cached), gemm (per-kernel-row matrix products, CPU), native "
                             "(oneDNN/cuDNN, NCHW) or channels_last")
