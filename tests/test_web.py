"""The web demo through Flask's test client: predict, decode, and bad requests as 4xx JSON."""
from __future__ import annotations

import base64
import io
import socket

import numpy as np
import pytest
import torch
from image_files import COLOUR_CLASSES, colour_bar_png, png_header, train_colour_model
from PIL import Image, ImageDraw

from capsnet.checkpoint import load_model
from capsnet.cli.main import main
from capsnet.inference import predict
from capsnet.models import build_model, make_config
from capsnet.preprocess import MAX_PIXELS, prepare_image
from capsnet.routing_trace import routing_trace
from capsnet.web import create_app
from capsnet.web.app import MAX_UPLOAD_BYTES


@pytest.fixture(scope="module")
def model(small_checkpoint):
    return load_model(small_checkpoint)


@pytest.fixture()
def client(model):
    return create_app(model).test_client()


def drawing_png() -> bytes:
    """What the page's canvas sends: black strokes on a white 280x280 PNG."""
    image = Image.new("RGBA", (280, 280), (255, 255, 255, 255))
    ImageDraw.Draw(image).line([(90, 60), (190, 60), (120, 230)], fill=(0, 0, 0, 255), width=20)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def data_url_image(url: str) -> np.ndarray:
    prefix = "data:image/png;base64,"
    assert url.startswith(prefix)
    with Image.open(io.BytesIO(base64.b64decode(url[len(prefix):]))) as image:
        return np.asarray(image)


def upload(client, data: bytes, name: str = "digit.png"):
    return client.post("/api/predict", data={"image": (io.BytesIO(data), name)},
                       content_type="multipart/form-data")


def assert_json_error(response, status: int, words: str):
    assert response.status_code == status
    assert response.is_json and words in response.get_json()["error"]


def test_page_and_static_files(client):
    page = client.get("/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    for needle in ('<canvas id="pad"', 'id="bars"', 'id="recon"', 'id="sliders"', "app.js",
                   'id="routing-panel"', 'id="routing-couplings"', 'id="routing-iterations"'):
        assert needle in html
    script = client.get("/static/app.js").get_data(as_text=True)
    assert "pointerdown" in script and "/api/decode" in script


def test_predict_a_drawing(client, model):
    png = drawing_png()
    response = upload(client, png)
    assert response.status_code == 200
    reply = response.get_json()
    expected = predict(png, model=model)
    assert reply["digit"] == expected.digit
    np.testing.assert_allclose(reply["lengths"], expected.lengths, rtol=1e-6)
    assert len(reply["pose"]) == 16 and len(reply["top"]) == 3
    np.testing.assert_array_equal(data_url_image(reply["input"]), expected.image)
    np.testing.assert_array_equal(data_url_image(reply["reconstruction"]), expected.reconstruction)


def test_predict_a_raw_body(client):
    response = client.post("/api/predict", data=drawing_png(), content_type="image/png")
    assert response.status_code == 200 and 0 <= response.get_json()["digit"] <= 9


def test_predict_a_raw_body_sent_as_a_form(client):
    """curl --data-binary @digit.png sends application/x-www-form-urlencoded: still an image."""
    png = drawing_png()
    response = client.post("/api/predict", data=png,
                           content_type="application/x-www-form-urlencoded")
    assert response.status_code == 200
    assert response.get_json()["digit"] == upload(client, png).get_json()["digit"]


def test_multipart_without_a_file_says_so(client):
    response = client.post("/api/predict", data={"note": "no image here"},
                           content_type="multipart/form-data")
    assert_json_error(response, 400, "multipart/form-data request with no file")


def test_predict_returns_the_routing_maps(client, model):
    png = drawing_png()
    reply = upload(client, png).get_json()
    maps = reply["routing"]
    cfg = model.config
    R, J, G = cfg.routing_iterations, cfg.num_classes, cfg.primary_grid
    assert (maps["iterations"], maps["capsules"], maps["grid"], maps["types"]) == (
        R, J, G, cfg.primary_types)
    assert maps["centres"] == [8, 10, 12, 14, 16, 18] and maps["field"] == 17
    couplings, support = np.array(maps["couplings"]), np.array(maps["support"])
    assert couplings.shape == support.shape == (R, J, G, G)
    np.testing.assert_allclose(couplings[0], 1.0 / J, atol=1e-5)  # iteration 1: uniform
    np.testing.assert_allclose(np.array(maps["shares"]).sum(axis=1), 1.0, atol=1e-4)
    trace = routing_trace(model, torch.from_numpy(prepare_image(png))[None])
    np.testing.assert_allclose(couplings, trace.coupling_maps()[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(support, trace.support_maps()[0].numpy(), atol=1e-5)
    assert maps["support_max"] == pytest.approx(support.max(), abs=1e-5)
    assert maps["coupling_spread"] == pytest.approx(np.abs(couplings - 1.0 / J).max(), abs=1e-5)
    assert int(trace.scores[0].argmax()) == reply["digit"]


@pytest.mark.parametrize("name, routing, children, symbol, iterations, grid", [
    ("efficient", "self-attention", "primary", "C", 1, 1),
    ("em", "em", "ConvCaps2", "R", 3, 3),
])
def test_predict_returns_the_routing_of_other_capsule_models(name, routing, children, symbol,
                                                             iterations, grid):
    torch.manual_seed(0)
    model = build_model(make_config(name, "small")).eval()
    png = drawing_png()
    reply = upload(create_app(model).test_client(), png).get_json()
    maps = reply["routing"]
    J = model.config.num_classes
    assert (maps["routing"], maps["children"], maps["symbol"]) == (routing, children, symbol)
    assert (maps["iterations"], maps["grid"], maps["capsules"]) == (iterations, grid, J)
    assert maps["meaning"].startswith(f"{symbol}_ij")
    trace = routing_trace(model, torch.from_numpy(prepare_image(png))[None])
    types = np.array(maps["type_couplings"])
    assert types.shape == (iterations, J, maps["types"])
    np.testing.assert_allclose(types, trace.type_maps()[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(np.array(maps["couplings"]), trace.coupling_maps()[0].numpy(),
                               atol=1e-5)
    np.testing.assert_allclose(np.array(maps["shares"]).sum(axis=1), 1.0, atol=1e-4)
    assert maps["type_spread"] == pytest.approx(np.abs(types - 1.0 / J).max(), abs=1e-5)
    assert maps["first_uniform"] == (name == "em")
    assert int(trace.scores[0].argmax()) == reply["index"]


def test_a_cnn_has_no_routing_maps():
    model = build_model(make_config("cnn", "small")).eval()
    reply = upload(create_app(model).test_client(), drawing_png()).get_json()
    assert reply["routing"] is None and reply["reconstruction"] is None


def test_decoding_the_unchanged_pose_gives_the_reconstruction(client):
    reply = upload(client, drawing_png()).get_json()
    decoded = client.post("/api/decode", json={"digit": reply["digit"], "pose": reply["pose"]})
    assert decoded.status_code == 200
    np.testing.assert_array_equal(data_url_image(decoded.get_json()["reconstruction"]),
                                  data_url_image(reply["reconstruction"]))
    moved = [v + (0.25 if d == 0 else 0.0) for d, v in enumerate(reply["pose"])]
    changed = client.post("/api/decode", json={"digit": reply["digit"], "pose": moved}).get_json()
    assert not np.array_equal(data_url_image(changed["reconstruction"]),
                              data_url_image(reply["reconstruction"]))


def test_not_an_image(client):
    assert_json_error(upload(client, b"just some text\n", "notes.txt"), 400, "not an image")


def test_empty_uploads(client):
    assert_json_error(upload(client, b""), 400, "empty")
    assert_json_error(client.post("/api/predict"), 400, "empty")


def test_blank_and_truncated_images(client):
    buffer = io.BytesIO()
    Image.new("L", (100, 100), 255).save(buffer, format="PNG")
    assert_json_error(upload(client, buffer.getvalue()), 400, "no ink")
    png = drawing_png()
    assert_json_error(upload(client, png[:len(png) // 2]), 400, "truncated")


def test_too_many_bytes(client):
    response = upload(client, b"\0" * (MAX_UPLOAD_BYTES + 1))
    assert_json_error(response, 413, "upload too large")


def test_too_many_pixels(client):
    side = int(MAX_PIXELS**0.5) + 1
    assert_json_error(upload(client, png_header(side, side)), 413, "too large")


@pytest.mark.parametrize("body", [
    {"digit": 3},
    {"digit": 3, "pose": [0.0] * 15},
    {"digit": 10, "pose": [0.0] * 16},
    {"digit": True, "pose": [0.0] * 16},
    {"digit": 3, "pose": ["a"] * 16},
    {"digit": 3, "pose": [1e9] * 16},
    [1, 2, 3],
])
def test_decode_rejects_bad_requests(client, body):
    response = client.post("/api/decode", json=body)
    assert response.status_code == 400 and "error" in response.get_json()


def test_decode_rejects_non_json(client):
    response = client.post("/api/decode", data="pose=1", content_type="text/plain")
    assert_json_error(response, 400, "JSON")


def test_unknown_routes_are_json(client):
    assert_json_error(client.get("/api/nothing"), 404, "Not Found")
    assert_json_error(client.get("/api/predict"), 405, "Method Not Allowed")


def test_serve_reports_a_busy_port(small_checkpoint, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        code = main(["serve", "--checkpoint", str(small_checkpoint), "--port", str(port)])
    assert code == 1
    assert "cannot listen on 127.0.0.1:" in capsys.readouterr().err


# ---- a colour model of named classes, trained on a tiny generated folder ----------------------

@pytest.fixture(scope="module")
def colour_model(tmp_path_factory):
    return load_model(train_colour_model(tmp_path_factory.mktemp("colour")))


def test_colour_model_names_classes_and_answers_in_colour(colour_model):
    client = create_app(colour_model).test_client()
    info = client.get("/api/model").get_json()
    assert info == {"classes": list(COLOUR_CLASSES), "dataset": "folder", "channels": 3,
                    "image_size": 32, "digits": False, "has_decoder": True}
    png = colour_bar_png()
    reply = upload(client, png).get_json()
    expected = predict(png, model=colour_model)
    assert reply["class"] == expected.class_name == COLOUR_CLASSES[reply["index"]]
    assert reply["digit"] == reply["index"] and reply["classes"] == list(COLOUR_CLASSES)
    seen = data_url_image(reply["input"])
    assert seen.shape == (32, 32, 3)
    np.testing.assert_array_equal(seen, expected.image)
    assert seen[..., 1].max() > 200 and seen[..., 0].max() < 100  # green stays green
    recon = data_url_image(reply["reconstruction"])
    assert recon.shape == (32, 32, 3)
    np.testing.assert_array_equal(recon, expected.reconstruction)
    assert reply["routing"]["size"] == 32 and reply["routing"]["capsules"] == 3
    decoded = client.post("/api/decode", json={"index": reply["index"], "pose": reply["pose"]})
    np.testing.assert_array_equal(data_url_image(decoded.get_json()["reconstruction"]), recon)


def test_digit_model_is_described_as_one(client):
    info = client.get("/api/model").get_json()
    assert info["digits"] is True and info["classes"] == [str(d) for d in range(10)]
