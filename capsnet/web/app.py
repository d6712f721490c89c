"""A one-page Flask app around the library: decode request -> library call -> encode response.

Routes:
    GET  /             the page (static/index.html, app.js, style.css)
    GET  /api/model    {"classes", "dataset", "channels", "image_size", "digits" (a digit
                       model: drawing makes sense), "has_decoder"}
    POST /api/predict  an image (multipart field 'image', or the raw body), prepared as by
                       `capsnet predict` -> "class", "index" (= "digit"), "classes", capsule
                       lengths, winning pose, input and reconstruction (PNG data URLs) and
                       "routing" (null for a CNN): {"iterations" R, "capsules" J, "grid" G,
                       "types" T, "size", "centres", "field", "children", "routing",
                       "symbol", "meaning", "support_label", "uniform", "first_uniform",
                       "couplings" (R, J, G, G), "support" (R, J, G, G), "shares" (R, J),
                       "type_couplings" (R, J, T), "coupling_spread", "type_spread",
                       "support_max"}
    POST /api/decode   JSON {"index": k, "pose": [D floats]} -> the decoded reconstruction

Every error is a JSON {"error": message} with a 4xx status (5xx only for a bug)."""
from __future__ import annotations

import base64
import io
import math
import socket
import threading
from http import HTTPStatus
from pathlib import Path

import numpy as np
import torch
from flask import Flask, jsonify, request
from PIL import Image
from torch import nn
from werkzeug.exceptions import HTTPException
from werkzeug.serving import BaseWSGIServer
from werkzeug.serving import make_server as werkzeug_make_server

from capsnet.data.model_view import class_names, is_digit_model
from capsnet.inference import decode_pose, model_device, predict_prepared, to_uint8
from capsnet.preprocess import ImageTooLargeError, PreprocessError, prepare_for_model
from capsnet.routing_trace import has_routing, routing_trace

STATIC_DIR = Path(__file__).resolve().parent / "static"
MAX_UPLOAD_BYTES = 10 * 1024 * 1024  # larger request bodies get 413 before they are read
MAX_POSE_VALUE = 10.0  # capsule lengths are < 1; anything far beyond is not a pose
TOP_K = 3
MAP_DECIMALS = 5  # routing maps: couplings differ from 1/J in the third or fourth decimal
MULTIPART = "multipart/form-data"
LISTEN_BACKLOG = 128


def png_data_url(image: np.ndarray) -> str:
    """uint8 (H, W) grey or (H, W, 3) RGB -> 'data:image/png;base64,...'."""
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def error(message: str, status: int = HTTPStatus.BAD_REQUEST):
    return jsonify(error=message), status


def create_app(model: nn.Module) -> Flask:
    """The demo app serving ``model`` (a CapsNet, or any model :func:`predict_prepared` takes)."""
    app = Flask(__name__, static_folder=str(STATIC_DIR), static_url_path="/static")
    app.config["MAX_CONTENT_LENGTH"] = MAX_UPLOAD_BYTES
    model.eval()
    lock = threading.Lock()  # one model call at a time across the server's threads
    has_decoder = getattr(model, "decoder", None) is not None
    routes = has_routing(model)

    @app.get("/")
    def index():
        return app.send_static_file("index.html")

    @app.get("/api/model")
    def api_model():  # the classes, the input the model takes, whether it is a digit model
        config = model.config
        return jsonify(classes=class_names(config), dataset=config.dataset,
                       channels=config.in_channels, image_size=config.image_size,
                       digits=is_digit_model(config), has_decoder=has_decoder)

    @app.post("/api/predict")
    def api_predict():
        return _predict_response(model, lock, routes)

    @app.post("/api/decode")
    def api_decode():
        return _decode_response(model, lock, has_decoder)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException):
        if exc.code == HTTPStatus.REQUEST_ENTITY_TOO_LARGE:
            return error(f"upload too large: the limit is {MAX_UPLOAD_BYTES // 2**20} MB",
                         HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        return error(f"{exc.name}: {exc.description}", exc.code or HTTPStatus.BAD_REQUEST)

    @app.errorhandler(Exception)
    def server_error(exc: Exception):  # a bug: the only 5xx
        app.logger.exception("unexpected error")
        return error(f"internal error ({type(exc).__name__})", HTTPStatus.INTERNAL_SERVER_ERROR)

    return app


def _predict_response(model: nn.Module, lock: threading.Lock, routes: bool):
    """POST /api/predict: the uploaded image -> prediction, reconstruction and routing."""
    if request.mimetype == MULTIPART and not request.files:
        return error(f"empty upload: a {MULTIPART} request with no file (send the image "
                     "as the field 'image', or as the raw request body)")
    data = _uploaded_bytes()
    if not data:
        return error("empty upload: choose an image file or draw a digit")
    try:
        image = prepare_for_model(data, model.config)  # (C, H, W) uint8
    except ImageTooLargeError as exc:
        return error(str(exc), HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
    except PreprocessError as exc:
        return error(str(exc))
    with lock:
        [p] = predict_prepared(model, image[None], ["upload"], TOP_K)
        routing = routing_maps(model, image) if routes else None
    return jsonify(digit=p.digit, index=p.index, length=p.length, lengths=p.lengths, top=p.top,
                   pose=p.pose, input=png_data_url(p.image), classes=p.class_names,
                   reconstruction=(png_data_url(p.reconstruction)
                                   if p.reconstruction is not None else None),
                   routing=routing, **{"class": p.class_name})


def _decode_response(model: nn.Module, lock: threading.Lock, has_decoder: bool):
    """POST /api/decode: JSON {"index": k, "pose": [D floats]} -> the decoded image."""
    if not has_decoder:
        return error("this model has no reconstruction decoder")
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        return error("expected a JSON object {\"index\": k, \"pose\": [numbers]}")
    digit, pose = body.get("index", body.get("digit")), body.get("pose")
    dim, num_classes = model.config.digit_dim, model.config.num_classes
    if not isinstance(digit, int) or isinstance(digit, bool) or not 0 <= digit < num_classes:
        return error(f"index (or digit) must be an integer in 0..{num_classes - 1}")
    if (not isinstance(pose, list) or len(pose) != dim
            or not all(_finite_number(v) for v in pose)):
        return error(f"pose must be a list of {dim} finite numbers within "
                     f"+-{MAX_POSE_VALUE}")
    with lock:
        vector = torch.tensor([pose], dtype=torch.float32, device=model_device(model))  # (1, D)
        recon = to_uint8(decode_pose(model, vector, digit))[0]  # (H, W) or (H, W, 3)
    return jsonify(reconstruction=png_data_url(recon))


def routing_maps(model: nn.Module, image: np.ndarray) -> dict:
    """The routing of one prepared uint8 image (C, H, W) as JSON-ready arrays."""
    trace = routing_trace(model, torch.from_numpy(image)[None])
    couplings = trace.coupling_maps()[0].cpu()  # (R, J, G, G)
    support = trace.support_maps()[0].cpu()  # (R, J, G, G)
    types = trace.type_maps()[0].cpu()  # (R, J, T)
    J = couplings.shape[1]
    children = trace.children
    first = trace.couplings[0, 0]  # (J, I) the first iteration's couplings
    first_uniform = bool((first == first[0, 0]).all())
    return {"iterations": trace.iterations, "capsules": J, "grid": trace.grid,
            "size": int(image.shape[-1]),
            "types": trace.types, "centres": children.centres, "field": children.field,
            "children": children.name, "routing": trace.routing,
            "symbol": trace.coupling_symbol, "meaning": trace.coupling_meaning,
            "support_label": trace.support_label, "first_uniform": first_uniform,
            "uniform": float(first[0, 0]) if first_uniform else 1.0 / J,
            "couplings": _rounded(couplings), "support": _rounded(support),
            "shares": _rounded(trace.routed_shares()[0].cpu()),  # (R, J)
            "type_couplings": _rounded(types),
            "coupling_spread": float((couplings - 1.0 / J).abs().max()),
            "type_spread": float((types - 1.0 / J).abs().max()),
            "support_max": float(support.max())}


def _rounded(values: torch.Tensor) -> list:
    return np.round(values.numpy().astype(np.float64), MAP_DECIMALS).tolist()


def _uploaded_bytes() -> bytes:
    """The multipart field 'image' (or the only file), else the raw body whatever its
    Content-Type (the form is then never parsed, which would consume the body)."""
    if request.mimetype == MULTIPART:
        upload = request.files.get("image") or next(iter(request.files.values()), None)
        return upload.read() if upload is not None else b""
    return request.get_data(cache=False)


def _finite_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and abs(value) <= MAX_POSE_VALUE)


def make_server(app: Flask, host: str = "127.0.0.1", port: int = 8000) -> BaseWSGIServer:
    """A threaded WSGI server for ``app`` on host:port (0: a free port, see ``server.port``),
    bound here so that a busy port raises OSError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
        return werkzeug_make_server(host, port, app, threaded=True, fd=sock.fileno())
