"""`capsnet export`: a checkpoint as an ONNX or TorchScript inference model."""
from __future__ import annotations

import argparse

import json
from pathlib import Path

from capsnet.export import FORMATS, export_checkpoint, read_description
from capsnet.pretrained import export_weights, weights_info


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "export", help="write an ONNX or TorchScript inference model",
        description="Export a trained model for inference outside this package. The file "
        "takes float images (B, 1, 28, 28) in [0, 1], any batch size, and returns the capsule "
        "lengths (B, 10) and the reconstructions (B, 1, 28, 28) of the predicted class.")
    p.add_argument("checkpoint", help="a .pt checkpoint written by `capsnet train`, or a "
                                      ".safetensors weights file")
    p.add_argument("--format", dest="fmt", default="onnx", choices=(*FORMATS, "safetensors"),
                   help="onnx (for onnxruntime and others), torchscript (torch.jit.load), or "
                        "safetensors (compact float16 weights that `--checkpoint` and "
                        "capsnet.pretrained.load_model read)")
    p.add_argument("-o", "--output", default=None,
                   help="file to write (default: beside the checkpoint, e.g. best.onnx or "
                        "best.ts.pt)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    if args.fmt == "safetensors":
        return _export_weights(args)
    path = export_checkpoint(args.checkpoint, args.output, args.fmt)
    info = read_description(path)
    shape = ", ".join(str(n) for n in info["input_shape"])
    print(f"wrote {path} ({args.fmt}): input {info['input']} ({shape}) in [0, 1] -> "
          f"{', '.join(info['outputs'])}")
    return 0


def _export_weights(args: argparse.Namespace) -> int:
    """float16 safetensors weights, carrying the run's results.json (if any) as info."""
    checkpoint = Path(args.checkpoint)
    results = checkpoint.parent / "results.json"
    info = json.loads(results.read_text()) if results.is_file() else {}
    for key in ("final", "best"):  # keep the headline numbers, drop the confusion matrices
        if isinstance(info.get(key), dict):
            info[key] = {k: info[key][k] for k in ("accuracy", "error") if k in info[key]}
    out = Path(args.output) if args.output else checkpoint.with_suffix(".safetensors")
    export_weights(checkpoint, out, info=info)
    size_mb = out.stat().st_size / 2**20
    print(f"wrote {out} (safetensors, float16, {size_mb:.1f} MB): {weights_info(out)['model']}")
    return 0
