"""`capsnet serve` and `capsnet export`: the local web demo, and inference files for use
outside this package."""
from __future__ import annotations

import argparse

from capsnet.checkpoint import weights_info
from capsnet.cli import args as cli_args
from capsnet.export import DEPRECATED_FORMATS, FORMATS, export_checkpoint, read_description

DEFAULT_PORT = 8000


def add_serve(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="start the local web demo",
        description="Serve a one-page web app: draw a digit or upload an image, see the "
        "prediction, the capsule lengths, the reconstruction, and move the winning "
        "capsule's dimensions with sliders.")
    cli_args.add_model_args(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="interface to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port (default: {DEFAULT_PORT}; 0 picks a free one)")
    p.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace, argv: list[str]) -> int:
    from capsnet.web import create_app, make_server

    model = cli_args.load_cli_model(args)
    try:
        server = make_server(create_app(model), args.host, args.port)
    except OSError as exc:
        reason = exc.strerror or exc
        raise ValueError(f"cannot listen on {args.host}:{args.port}: {reason}") from None
    print(f"capsnet demo on http://{args.host}:{server.port}/ (Ctrl+C to stop)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0


def add_export(subparsers) -> None:
    p = subparsers.add_parser(
        "export", help="write an ONNX or torch.export inference model",
        description="Export a trained model for inference outside this package. The file "
        "takes float images (B, C, H, W) in [0, 1] at the model's channels and size ((B, 1, "
        "28, 28) for MNIST), any batch size, and returns the class scores (B, J) and the "
        "reconstructions (B, C, H, W) of the predicted class; its metadata hold the input "
        "shape and the class names.")
    p.add_argument("checkpoint", help="a .pt checkpoint written by `capsnet train`, or a "
                                      ".safetensors weights file")
    p.add_argument("--format", dest="fmt", default="onnx", choices=(*FORMATS, "safetensors"),
                   help="onnx (for onnxruntime and others; the dynamo-based exporter), pt2 (a "
                        "torch.export program: torch.export.load), torchscript (deprecated: "
                        "writes pt2), or safetensors (compact float16 weights that "
                        "`--checkpoint` and capsnet.checkpoint.load_model read)")
    p.add_argument("-o", "--output", default=None,
                   help="file to write (default: beside the checkpoint, e.g. best.onnx or "
                        "best.pt2)")
    p.set_defaults(func=run_export)


def run_export(args: argparse.Namespace, argv: list[str]) -> int:
    path = export_checkpoint(args.checkpoint, args.output, args.fmt)
    if args.fmt == "safetensors":
        size_mb = path.stat().st_size / 2**20
        print(f"wrote {path} (safetensors, float16, {size_mb:.1f} MB): "
              f"{weights_info(path)['model']}")
        return 0
    info = read_description(path)
    shape = ", ".join(str(n) for n in info["input_shape"])
    fmt = DEPRECATED_FORMATS.get(args.fmt, args.fmt)
    print(f"wrote {path} ({fmt}): input {info['input']} ({shape}) in [0, 1] -> "
          f"{', '.join(info['outputs'])}; classes {', '.join(info['class_names'])}")
    return 0
