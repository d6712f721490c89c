"""`capsnet export`: a checkpoint as an ONNX or TorchScript inference model."""
from __future__ import annotations

import argparse

from capsnet.checkpoint import weights_info
from capsnet.export import FORMATS, export_checkpoint, read_description


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "export", help="write an ONNX or TorchScript inference model",
        description="Export a trained model for inference outside this package. The file "
        "takes float images (B, C, H, W) in [0, 1] at the model's channels and size ((B, 1, "
        "28, 28) for MNIST), any batch size, and returns the capsule lengths (B, J) and the "
        "reconstructions (B, C, H, W) of the predicted class; its metadata hold the input "
        "shape and the class names.")
    p.add_argument("checkpoint", help="a .pt checkpoint written by `capsnet train`, or a "
                                      ".safetensors weights file")
    p.add_argument("--format", dest="fmt", default="onnx", choices=(*FORMATS, "safetensors"),
                   help="onnx (for onnxruntime and others), torchscript (torch.jit.load), or "
                        "safetensors (compact float16 weights that `--checkpoint` and "
                        "capsnet.checkpoint.load_model read)")
    p.add_argument("-o", "--output", default=None,
                   help="file to write (default: beside the checkpoint, e.g. best.onnx or "
                        "best.ts.pt)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    path = export_checkpoint(args.checkpoint, args.output, args.fmt)
    if args.fmt == "safetensors":
        size_mb = path.stat().st_size / 2**20
        print(f"wrote {path} (safetensors, float16, {size_mb:.1f} MB): "
              f"{weights_info(path)['model']}")
        return 0
    info = read_description(path)
    shape = ", ".join(str(n) for n in info["input_shape"])
    print(f"wrote {path} ({args.fmt}): input {info['input']} ({shape}) in [0, 1] -> "
          f"{', '.join(info['outputs'])}; classes {', '.join(info['class_names'])}")
    return 0
