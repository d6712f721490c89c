"""`capsnet serve`: the local web demo (draw a digit, see its capsules, move their poses)."""
from __future__ import annotations

import argparse

from capsnet.cli.args import add_model_args, load_cli_model

DEFAULT_PORT = 8000


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="start the local web demo",
        description="Serve a one-page web app: draw a digit or upload an image, see the "
        "prediction, the capsule lengths, the reconstruction, and move the winning "
        "capsule's dimensions with sliders.")
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="interface to listen on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port (default: {DEFAULT_PORT}; 0 picks a free one)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    from capsnet.web import create_app, make_server

    model = load_cli_model(args)
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
