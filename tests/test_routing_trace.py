"""The routing trace (couplings, agreements, maps per iteration), its figure, `capsnet routing`."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from capsnet.checkpoint import save_checkpoint
from capsnet.cli.main import main
from capsnet.figures import routing_figure, routing_types_figure
from capsnet.models import build_model, class_scores, make_config
from capsnet.routing_trace import receptive_fields, routing_trace
from tests.conftest import last_error_line

B = 3  # images per batch: a few are enough
W_SCALE = 300.0  # with the initial W (std 0.01) and short primary capsules routing barely moves


def small_capsnet(seed: int = 0, **overrides) -> torch.nn.Module:
    """A fresh small CapsNet whose predictions are large enough for routing to move."""
    torch.manual_seed(seed)
    model = build_model(make_config("capsnet", "small", **overrides)).eval()
    with torch.no_grad():
        model.digit_caps.W.mul_(W_SCALE)
    return model


def images_for(model, seed: int = 1) -> torch.Tensor:
    """uint8 images (B, H, W) with a bright stroke on noise, shaped for ``model``."""
    g = torch.Generator().manual_seed(seed)
    size = model.config.image_size
    images = torch.randint(0, 60, (B, size, size), generator=g, dtype=torch.uint8)
    images[:, size // 4:3 * size // 4, size // 2 - 1:size // 2 + 1] = 255
    return images


def model_input(images: torch.Tensor) -> torch.Tensor:
    return images.unsqueeze(1).float() / 255  # (B, 1, H, W)


@pytest.fixture(scope="module")
def model():
    return small_capsnet()


@pytest.fixture(scope="module")
def trace(model):
    return routing_trace(model, images_for(model))


def test_shapes(model, trace):
    cfg = model.config
    R, J, G = cfg.routing_iterations, cfg.num_classes, cfg.primary_grid
    I = cfg.num_primary_caps  # noqa: E741 (the paper's name for the input capsules)
    assert trace.couplings.shape == trace.agreements.shape == (B, R, J, I)
    assert trace.couplings.dtype == torch.float32
    assert trace.v.shape == (B, J, cfg.digit_dim) and trace.scores.shape == (B, J)
    assert trace.primary_lengths.shape == (B, cfg.primary_types, G, G)
    assert trace.u_hat_norms.shape == (B, J, I)
    assert trace.coupling_maps().shape == trace.support_maps().shape == (B, R, J, G, G)
    assert trace.routed_shares().shape == (B, R, J)


def test_couplings_sum_to_one_and_start_uniform(trace):
    J = trace.couplings.shape[2]
    sums = trace.couplings.sum(dim=2)  # (B, R, I)
    torch.testing.assert_close(sums, torch.ones_like(sums))
    assert torch.equal(trace.couplings[:, 0], torch.full_like(trace.couplings[:, 0], 1.0 / J))
    assert (trace.couplings[:, -1] - 1.0 / J).abs().max() > 0.1  # routing moved them
    shares = trace.routed_shares()  # (B, R, J)
    torch.testing.assert_close(shares.sum(dim=-1), torch.ones(shares.shape[:2]))
    torch.testing.assert_close(shares[:, 0], torch.full_like(shares[:, 0], 1.0 / J))


def test_each_iteration_couples_by_the_agreements_so_far(trace):
    """Procedure 1: c(r+1) = softmax over j of b, b = the sum of the agreements of 1..r."""
    for r in range(1, trace.iterations):
        logits = trace.agreements[:, :r].sum(dim=1)  # (B, J, I)
        torch.testing.assert_close(trace.couplings[:, r], torch.softmax(logits, dim=1))


def test_trace_equals_the_model_and_leaves_it_unchanged(model):
    images = images_for(model)
    x = model_input(images)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        before = model(x)
    trace = routing_trace(model, images)
    with torch.no_grad():
        after = model(x)
    assert torch.equal(trace.v, before.poses) and torch.equal(trace.scores, before.scores)
    for a, b in zip(before, after, strict=True):  # ModelOutput: tensors, None, the loss
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    assert not model.training
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert torch.equal(routing_trace(model, x).v, trace.v)  # float input = uint8 input


def test_trace_runs_in_the_models_compute_precision():
    model = small_capsnet(seed=2)
    model.compute_dtype = torch.bfloat16
    images = images_for(model)
    with torch.no_grad():
        out = model(model_input(images))
    trace = routing_trace(model, images)
    assert torch.equal(trace.v, out.poses) and torch.equal(trace.scores, out.scores)


def test_primary_grid_is_type_major(model, trace):
    """primary_lengths[b, t, r, c] is the squashed length of the conv output's capsule of
    type t at grid cell (r, c), read straight from PrimaryCaps' convolution."""
    cfg = model.config
    with torch.no_grad():
        h = torch.relu(model.conv1(model_input(images_for(model))))
        raw = model.primary_caps.conv(h)  # (B, types*dim, G, G)
    G = raw.shape[-1]
    norms = raw.view(B, cfg.primary_types, cfg.primary_dim, G, G).norm(dim=2)  # (B, T, G, G)
    torch.testing.assert_close(trace.primary_lengths, norms**2 / (1 + norms**2))


@pytest.mark.parametrize("image_size, conv1_stride", [(28, 1), (36, 1), (48, 2), (47, 3)])
def test_receptive_fields_match_the_input_gradient(image_size, conv1_stride):
    """The slow, obviously-right reference: the input pixels a primary cell depends on."""
    model = small_capsnet(image_size=image_size, conv1_stride=conv1_stride)
    centres, side = receptive_fields(model.config)
    G = model.config.primary_grid
    assert len(centres) == G
    if image_size == 28:
        assert centres == [8, 10, 12, 14, 16, 18] and side == 17
    for row, col in [(0, 0), (G - 1, 1), (G // 2, G - 1)]:
        x = torch.rand(1, 1, image_size, image_size, requires_grad=True)
        model.primary_caps.conv(model.conv1(x))[0, :, row, col].sum().backward()
        rows, cols = (x.grad[0, 0] != 0).nonzero(as_tuple=True)
        for seen, g in [(rows, row), (cols, col)]:
            assert (seen.min() + seen.max()).item() / 2 == centres[g]
            assert (seen.max() - seen.min()).item() + 1 == side


def test_a_model_without_routing_is_refused():
    with pytest.raises(ValueError, match="routing needs a CapsNet"):
        routing_trace(build_model(make_config("cnn", "small")), torch.zeros(1, 28, 28))


@pytest.mark.slow
def test_routing_figure_takes_grey_and_colour_inputs(trace, tmp_path):
    maps, support = trace.coupling_maps().numpy(), trace.support_maps().numpy()
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (28, 28), dtype=np.uint8),
              rng.integers(0, 256, (28, 28), dtype=np.uint8),
              rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)]  # display layout: (H, W, 3)
    centres, side = receptive_fields(make_config("capsnet", "small"))
    path = routing_figure(images, maps, support, trace.scores.numpy(), ["a", "b", "c"],
                          centres, side, tmp_path / "sub" / "routing.png", [False, True, False])
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size[0] > image.size[1] > 0


# ---- the command ----------------------------------------------------------------------------

def routing_command(checkpoint, *extra: str) -> list[str]:
    return ["routing", "--checkpoint", str(checkpoint), *extra]


def test_cli_routing_of_test_images(small_checkpoint, tiny_mnist_dir, tmp_path, capsys):
    out = tmp_path / "routing.png"
    assert main(routing_command(small_checkpoint, "--index", "0", "5", "--data-dir",
                                str(tiny_mnist_dir), "--no-download", "--out", str(out))) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}: 2 images, 3 routing iterations, 8 capsule types on a 6x6" in text
    assert "mis-classified" in text
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size[0] > image.size[1]


def test_cli_routing_of_own_images(small_checkpoint, tmp_path, capsys):
    own = tmp_path / "seven.png"
    image = Image.new("L", (120, 120), 255)
    ImageDraw.Draw(image).line([(20, 20), (100, 20), (50, 110)], fill=0, width=10)
    image.save(own)
    out = tmp_path / "own.png"
    assert main(routing_command(small_checkpoint, str(own), "--out", str(out))) == 0
    assert "1 image, 3 routing iterations" in capsys.readouterr().out and out.is_file()


@pytest.mark.parametrize("extra, words", [
    ([], "give either IMAGE files or --index"),
    (["x.png", "--index", "0"], "give either IMAGE files or --index"),
    (["--index", "200"], "--index 200 is out of range: the test set has 200 images"),
    (["missing.png"], "missing.png: no such file"),
])
def test_cli_routing_errors_are_one_line(extra, words, small_checkpoint, tiny_mnist_dir,
                                         tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = ["--data-dir", str(tiny_mnist_dir), "--no-download"]
    assert main(routing_command(small_checkpoint, *extra, *data)) == 1
    assert words in last_error_line(capsys)


def test_cli_routing_needs_a_capsnet(tmp_path, capsys):
    cnn = tmp_path / "cnn.pt"
    save_checkpoint(cnn, build_model(make_config("cnn", "small")))
    own = tmp_path / "one.png"
    image = Image.new("L", (60, 60), 0)
    ImageDraw.Draw(image).line([(30, 5), (30, 55)], fill=255, width=6)
    image.save(own)
    assert main(["routing", "--checkpoint", str(cnn), str(own)]) == 1
    assert "routing needs a CapsNet" in last_error_line(capsys)


# ---- Efficient-CapsNet and the EM model ------------------------------------------------------

@pytest.fixture(scope="module", params=["efficient", "em"])
def other_model(request):
    torch.manual_seed(3)
    return build_model(make_config(request.param, "small")).eval()


def test_other_models_trace_their_own_outputs_and_couplings(other_model):
    images = images_for(other_model)
    with torch.no_grad():
        out = other_model(model_input(images))
    trace = routing_trace(other_model, images)
    assert torch.equal(trace.v, out.poses) and torch.equal(trace.scores, class_scores(out))
    cfg, J = other_model.config, other_model.config.num_classes
    em = trace.routing == "em"
    assert trace.routing == ("em" if em else "self-attention")
    assert trace.iterations == (cfg.routing_iterations if em else 1)  # self-attention: one pass
    I = trace.types * trace.grid**2  # noqa: E741
    assert trace.couplings.shape == (B, trace.iterations, J, I)
    sums = trace.couplings.sum(dim=2)  # (B, R, I): every child's shares over the classes
    torch.testing.assert_close(sums, torch.ones_like(sums))
    torch.testing.assert_close(trace.routed_shares().sum(dim=-1), torch.ones(B, trace.iterations))
    G, T = trace.grid, trace.types
    assert trace.coupling_maps().shape == trace.support_maps().shape == (B, trace.iterations, J,
                                                                          G, G)
    assert trace.type_maps().shape == trace.type_support().shape == (B, trace.iterations, J, T)
    torch.testing.assert_close(trace.type_maps().mean(dim=-1),
                               trace.coupling_maps().mean(dim=(-2, -1)))
    if em:  # EM's first M-step assigns every child uniformly; the votes weigh by a_i
        assert torch.equal(trace.couplings[:, 0], torch.full_like(trace.couplings[:, 0], 1 / J))
        torch.testing.assert_close(trace.contributions()[:, -1],
                                   trace.couplings[:, -1] * trace.strengths[:, None])
        assert trace.support_label == "R\u00b7a" and trace.agreements is None
    else:
        assert trace.support_label == "|C\u00b7\u00fb|"


def test_em_children_are_convcaps2_on_its_grid_position_major():
    """primary_lengths[b, t, r, c] is ConvCaps2's activation of type t at (r, c), read from
    the layers; the grid's centres are those coordinate addition adds (scaled by the size)."""
    torch.manual_seed(4)
    model = build_model(make_config("em", "small")).eval()
    x = model_input(images_for(model))
    with torch.no_grad():
        h = torch.relu(model.conv1(x))
        _, a = model.conv_caps2(*model.conv_caps1(*model.primary_caps(h)))  # (B, G, G, T)
    trace = routing_trace(model, x)
    assert trace.children.name == "ConvCaps2" and trace.children.strength == "activation"
    torch.testing.assert_close(trace.primary_lengths, a.permute(0, 3, 1, 2))
    cfg = model.config
    assert trace.children.centres == [c * cfg.image_size - 0.5 for c in cfg.class_coordinates]


@pytest.mark.parametrize("image_size", [28, 36])
def test_efficient_receptive_fields_match_the_input_gradient(image_size):
    torch.manual_seed(5)
    model = build_model(make_config("efficient", "small", image_size=image_size)).eval()
    trace = routing_trace(model, torch.zeros(1, image_size, image_size, dtype=torch.uint8))
    centres, side, G = trace.children.centres, trace.children.field, trace.grid
    assert len(centres) == G == model.config.primary_grid
    for row, col in [(0, 0), (G - 1, G // 2)]:
        x = torch.rand(1, 1, image_size, image_size, requires_grad=True)
        model.primary_caps.conv(model.features(x))[0, :, row, col].sum().backward()
        rows, cols = (x.grad[0, 0] != 0).nonzero(as_tuple=True)
        for seen, g in [(rows, row), (cols, col)]:
            assert (seen.min() + seen.max()).item() / 2 == centres[g]
            assert (seen.max() - seen.min()).item() + 1 == side


@pytest.mark.parametrize("name, words", [
    ("efficient", ["1 routing iteration, 8 capsule types on a 1x1 primary grid",
                   "self-attention routing", "C_ij"]),
    pytest.param("em", ["3 routing iterations, 16 capsule types on a 3x3 ConvCaps2 grid",
                        "em routing", "R_ij"], marks=pytest.mark.slow),
])
def test_cli_routing_of_other_models(name, words, tiny_mnist_dir, tmp_path, capsys):
    torch.manual_seed(6)
    checkpoint = tmp_path / f"{name}.pt"
    save_checkpoint(checkpoint, build_model(make_config(name, "small")))
    out = tmp_path / f"{name}.png"
    assert main(routing_command(checkpoint, "--index", "0", "3", "--data-dir",
                                str(tiny_mnist_dir), "--no-download", "--out", str(out))) == 0
    text = capsys.readouterr().out
    assert f"wrote {out}: 2 images, " in text and all(w in text for w in words)
    with Image.open(out) as image:
        assert image.format == "PNG" and image.size[0] > image.size[1]


def test_routing_types_figure_takes_grey_and_colour_inputs(tmp_path):
    rng = np.random.default_rng(1)
    maps = rng.dirichlet(np.ones(10), size=(2, 1, 8)).transpose(0, 1, 3, 2)  # (N, R, J, T)
    images = [rng.integers(0, 256, (28, 28), dtype=np.uint8),
              rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)]
    path = routing_types_figure(images, maps, maps * 2, rng.random((2, 10)), ["a", "b"],
                                tmp_path / "types.png", [False, True], symbol="C")
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size[0] > image.size[1] > 0
