"""Efficient-CapsNet (``--model efficient``): parameter counts, derived sizes, shapes, its
squash by hand, self-attention routing against a loop written from the paper's equations,
gradients, checkpoints, the memory estimate, and the command line end to end on the tiny
fake MNIST. Parity with the public TensorFlow code: tests/test_efficient_parity.py."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from capsnet.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from capsnet.cli.main import main
from capsnet.config import config_to_dict, conv_output_size
from capsnet.losses import model_loss
from capsnet.models import (
    EfficientCapsNet,
    EfficientCapsNetConfig,
    build_model,
    config_from_dict,
    count_parameters,
    make_config,
    model_name_of,
)
from capsnet.routing import ROUTERS, SelfAttentionRouter, router_class
from capsnet.squashing import exp_squash
from tests.helpers_routing import self_attention_reference

# The paper's Table 1 / the public code's model summary: 161,824 trainable parameters.
PAPER_PARAMETERS = 161_824
# The decoder: (160 * 512 + 512) + (512 * 1024 + 1024) + (1024 * 784 + 784).
DECODER_PARAMETERS = 1_411_344
# Per layer (weights + biases; BatchNorm: gamma + beta, its running statistics are buffers).
LAYER_PARAMETERS = {
    "features.0": 5 * 5 * 1 * 32 + 32 + 2 * 32,  # 896
    "features.1": 3 * 3 * 32 * 64 + 64 + 2 * 64,  # 18,624
    "features.2": 3 * 3 * 64 * 64 + 64 + 2 * 64,  # 37,056
    "features.3": 3 * 3 * 64 * 128 + 128 + 2 * 128,  # 74,112
    "primary_caps": 9 * 9 * 128 + 128,  # 10,496: depthwise
    "class_caps": 16 * 10 * 8 * 16 + 10 * 16,  # 20,640: W and the log priors B
}


def paper_model(**overrides) -> EfficientCapsNet:
    torch.manual_seed(0)
    return EfficientCapsNet(make_config("efficient", "paper", **overrides))


# --- sizes ----------------------------------------------------------------------------------

def test_parameter_count_is_the_papers():
    model = paper_model()
    assert count_parameters(model) - count_parameters(model.decoder) == PAPER_PARAMETERS
    assert count_parameters(model.decoder) == DECODER_PARAMETERS
    assert count_parameters(model) == PAPER_PARAMETERS + DECODER_PARAMETERS  # 1,573,168
    assert count_parameters(paper_model(use_decoder=False)) == PAPER_PARAMETERS
    for name, expected in LAYER_PARAMETERS.items():
        assert count_parameters(model.get_submodule(name)) == expected, name
    assert sum(LAYER_PARAMETERS.values()) == PAPER_PARAMETERS


@pytest.mark.parametrize("image_size, feature_grid, primary_grid, num_primary", [
    (28, 9, 1, 16),  # MNIST: 128 channels of a 1x1 map, 8 each
    (32, 11, 3, 144),  # 32x32 images: 3 x 3 x 16
    (40, 15, 7, 784),  # the affNIST canvas
])
def test_primary_capsules_are_derived_from_the_sizes(image_size, feature_grid, primary_grid,
                                                     num_primary):
    cfg = EfficientCapsNetConfig(image_size=image_size)
    assert (cfg.feature_grid, cfg.primary_grid, cfg.num_primary_caps) == \
        (feature_grid, primary_grid, num_primary)
    model = EfficientCapsNet(cfg).eval()
    with torch.no_grad():
        h = model.features(torch.rand(2, 1, image_size, image_size))
        assert h.shape == (2, 128, feature_grid, feature_grid)
        assert model.primary_caps(h).shape == (2, num_primary, cfg.primary_dim)


def test_config_errors_and_round_trip():
    with pytest.raises(ValueError, match="too small"):
        EfficientCapsNetConfig(image_size=20)  # 20 -> 16 -> 14 -> 12 -> 5, below the 9x9 kernel
    with pytest.raises(ValueError, match="do not make primary capsules"):
        EfficientCapsNetConfig(primary_dim=12)
    with pytest.raises(ValueError, match="differ in length"):
        EfficientCapsNetConfig(conv_kernels=(5, 3))
    with pytest.raises(ValueError, match="unknown preset 'half' for efficient; choose from paper"):
        make_config("efficient", "half")
    cfg = make_config("efficient", "small", image_size=32, in_channels=3, num_classes=3,
                      class_names=("a", "b", "c"))
    with pytest.raises(ValueError, match="unknown option 'input_norm', 'routing_iterations' for "
                                         "efficient; choose from image_size"):
        make_config("efficient", routing_iterations=7, input_norm="image")
    assert config_from_dict("efficient", json.loads(json.dumps(config_to_dict(cfg)))) == cfg
    assert model_name_of(cfg) == "efficient"
    assert isinstance(build_model(cfg), EfficientCapsNet)


@pytest.mark.parametrize("B", [1, 3])
def test_shapes_through_every_layer(B):
    model = paper_model()
    x, y = torch.rand(B, 1, 28, 28), torch.arange(B)
    h = x
    for block, side in zip(model.features, (24, 22, 20, 9), strict=True):
        h = block(h)
        assert h.shape[-2:] == (side, side)
    assert h.shape == (B, 128, 9, 9)
    u = model.primary_caps(h)
    assert u.shape == (B, 16, 8) and u.dtype == torch.float32
    assert model.class_caps.predictions(u).shape == (B, 10, 16, 16)
    out = model(x, y)
    assert out.poses.shape == (B, 10, 16) and out.scores.shape == (B, 10)
    assert out.reconstructions.shape == (B, 1, 28, 28)
    torch.testing.assert_close(out.scores, out.poses.norm(dim=-1))
    assert paper_model(use_decoder=False)(x).reconstructions is None


# --- the squash -------------------------------------------------------------------------------

def test_exp_squash_by_hand():
    s = torch.tensor([[3.0, 4.0], [0.0, 0.0], [1e-4, 0.0], [-0.06, 0.08], [1e30, -1e30]])
    v = exp_squash(s)
    factor = (1 - math.exp(-5.0)) / 5.0  # |(3, 4)| = 5
    torch.testing.assert_close(v[0], torch.tensor([3.0, 4.0]) * factor)
    torch.testing.assert_close(v[1], torch.zeros(2))
    torch.testing.assert_close(v[2], torch.tensor([(1 - math.exp(-1e-4)), 0.0]))
    torch.testing.assert_close(v[3], torch.tensor([-0.06, 0.08]) * (1 - math.exp(-0.1)) / 0.1)
    torch.testing.assert_close(v[4], torch.tensor([1.0, -1.0]) / math.sqrt(2))  # unit length
    assert (v.norm(dim=-1) < 1).all()


def test_exp_squash_matches_the_closed_form_and_its_gradient():
    torch.manual_seed(0)
    direction = torch.nn.functional.normalize(torch.randn(400, 8, dtype=torch.float64), dim=-1)
    lengths = torch.logspace(-8, 2, 400, dtype=torch.float64)[:, None]
    s = (direction * lengths).requires_grad_()
    n = s.norm(dim=-1, keepdim=True)
    exact = -torch.expm1(-n) / n * s  # float64: (1 - e^-|s|) s / |s|
    s32 = s.detach().float().requires_grad_()
    got = exp_squash(s32)
    torch.testing.assert_close(got.double(), exact.detach(), rtol=1e-6, atol=1e-12)
    weights = torch.randn_like(exact)
    (exact * weights).sum().backward()
    (got * weights.float()).sum().backward()
    torch.testing.assert_close(s32.grad.double(), s.grad, rtol=1e-4, atol=1e-6)


def test_exp_squash_gradient_is_the_identity_at_zero_and_finite_for_huge_vectors():
    s = torch.zeros(3, 4, requires_grad=True)
    jacobian = torch.autograd.functional.jacobian(exp_squash, s[0].detach())
    torch.testing.assert_close(jacobian, torch.eye(4))
    huge = torch.tensor([[3e38, -3e38, 1.0]], requires_grad=True)
    out = exp_squash(huge)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(huge.grad).all()


# --- self-attention routing -----------------------------------------------------------------

def test_self_attention_routing_equals_the_slow_loop_of_the_papers_equations():
    torch.manual_seed(0)
    B, J, I, D = 2, 4, 5, 6
    router = SelfAttentionRouter(J, I)
    with torch.no_grad():
        router.b.normal_(0, 0.3)  # nonzero log priors: B must enter after the softmax
    u_hat = torch.randn(B, J, I, D, dtype=torch.float64) * 0.5
    routed = router.double()(u_hat)
    expected = self_attention_reference(u_hat, router.b.detach())
    v, c = expected.poses, expected.couplings[0]
    torch.testing.assert_close(routed.poses, v)
    torch.testing.assert_close(routed.couplings[0], c)
    torch.testing.assert_close(routed.activations, v.norm(dim=-1))
    assert len(routed.couplings) == 1  # one pass
    torch.testing.assert_close(c.sum(dim=1), torch.ones(B, I, dtype=torch.float64))


def test_the_router_is_registered_learns_its_priors_and_stays_float32():
    assert ROUTERS["self-attention"] is SelfAttentionRouter
    assert router_class("self-attention") is SelfAttentionRouter
    router = SelfAttentionRouter(10, 16)
    u_hat = torch.randn(3, 10, 16, 16, requires_grad=True)
    routed = router(u_hat)
    routed.activations.sum().backward()
    assert router.b.grad is not None and router.b.grad.abs().sum() > 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        routed = router(u_hat.detach().bfloat16())
    assert routed.poses.dtype == routed.couplings[0].dtype == torch.float32
    with pytest.raises(ValueError, match="fully connected capsule layers only"):
        router(u_hat, children=torch.zeros(10, 16, dtype=torch.long), num_children=16)


# --- the model: gradients, extreme inputs, decoder, checkpoints, memory -------------------------

@pytest.mark.parametrize("preset", ["small", "paper"])
def test_every_parameter_gets_a_gradient(preset):
    torch.manual_seed(0)
    model = build_model(make_config("efficient", preset))
    x, y = torch.rand(4, 1, 28, 28), torch.tensor([3, 7, 0, 1])
    model_loss(model(x, y), x, y).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} received no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name} has an all-zero gradient"


@pytest.mark.parametrize("fill", [0.0, 1e6, -1e6])
@pytest.mark.parametrize("train", [True, False])
def test_extreme_inputs_give_finite_outputs_and_gradients(fill, train):
    model = paper_model().train(train)
    x, y = torch.full((2, 1, 28, 28), fill), torch.tensor([1, 2])
    out = model(x, y)
    assert torch.isfinite(out.scores).all() and (out.scores < 1).all()
    assert torch.isfinite(out.reconstructions).all()
    loss = model_loss(out, x, y)
    loss.backward()
    assert torch.isfinite(loss)
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name


def test_reconstruction_uses_the_label_when_given_else_the_longest_capsule():
    model = paper_model().eval()
    x = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        free = model(x)
        predicted = free.scores.argmax(-1)
        other = (predicted + 1) % 10
        guided = model(x, other)
        torch.testing.assert_close(free.reconstructions, model.decoder(free.poses, predicted))
        torch.testing.assert_close(guided.reconstructions, model.decoder(guided.poses, other))
        torch.testing.assert_close(guided.poses, free.poses)


def test_checkpoint_round_trip_keeps_weights_and_batchnorm_statistics(tmp_path):
    model = paper_model()
    x, y = torch.rand(8, 1, 28, 28), torch.arange(8)
    model_loss(model(x, y), x, y)  # a training-mode pass moves the BatchNorm statistics
    assert model.features[0].norm.num_batches_tracked == 1
    save_checkpoint(tmp_path / "m.pt", model)
    loaded = model_from_checkpoint(tmp_path / "m.pt")
    assert isinstance(loaded, EfficientCapsNet) and loaded.config == model.config
    with torch.no_grad():
        a, b = model.eval()(x), loaded(x)
    torch.testing.assert_close(a.scores, b.scores, rtol=0, atol=0)
    torch.testing.assert_close(a.reconstructions, b.reconstructions, rtol=0, atol=0)
    torch.testing.assert_close(loaded.features[3].norm.running_var,
                               model.features[3].norm.running_var)


def test_the_learning_rate_default_is_efficient_capsnets_own():
    from capsnet.cli.args import settings_from_args
    from capsnet.cli.main import build_parser
    from capsnet.models import MODELS
    from capsnet.training.settings import TrainSettings

    assert MODELS["efficient"].lr == 5e-4  # config.json "lr" of the public code
    assert TrainSettings(model="efficient").lr == 5e-4
    args = build_parser().parse_args(["train", "--model", "efficient"])
    assert settings_from_args(args).lr == 5e-4
    args = build_parser().parse_args(["train", "--model", "efficient", "--lr", "1e-3"])
    assert settings_from_args(args).lr == 1e-3


# --- the command line end to end ------------------------------------------------------------

VAL_SIZE, TRAIN_SUBSET, BATCH = 100, 200, 50
TEST_IMAGES = 200  # in the conftest's tiny_mnist_dir


def train_command(data_dir: Path, out_dir: Path, *extra: str) -> list[str]:
    return ["train", "--model", "efficient", "--no-download", "--data-dir", str(data_dir),
            "--val-size", str(VAL_SIZE), "--subset", str(TRAIN_SUBSET), "--batch-size",
            str(BATCH), "--no-progress", "--out-dir", str(out_dir), *extra]


@pytest.fixture(autouse=True)
def _work_in_tmp(tmp_path, monkeypatch):
    """Run every command from a scratch directory so that defaults never write into the repo."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module")
def full_run(tiny_mnist_dir, tmp_path_factory) -> Path:
    """An uninterrupted two-epoch run of the paper-size Efficient-CapsNet, its speed plan
    measured (into a cache of its own: the conftest's isolation is per test function)."""
    out = tmp_path_factory.mktemp("efficient") / "full"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CAPSNET_CACHE_DIR", str(out.parent / "cache"))
        assert main(train_command(tiny_mnist_dir, out, "--epochs", "2")) == 0
    return out


@pytest.mark.slow
def test_train_writes_a_run_that_rebuilds_the_model(full_run):
    config = json.loads((full_run / "config.json").read_text())
    assert config["settings"]["model"] == "efficient" and config["settings"]["lr"] == 5e-4
    assert config["model_config"]["conv_channels"] == [32, 64, 64, 128]
    results = json.loads((full_run / "results.json").read_text())
    assert results["complete"] and results["epochs"] == 2
    assert sum(map(sum, results["best"]["confusion"])) == TEST_IMAGES
    model = model_from_checkpoint(full_run / "best.pt")
    assert isinstance(model, EfficientCapsNet)
    assert count_parameters(model) == PAPER_PARAMETERS + DECODER_PARAMETERS
    assert load_checkpoint(full_run / "last.pt")["model"] == "efficient"


@pytest.mark.slow
def test_resume_matches_an_uninterrupted_run(tiny_mnist_dir, tmp_path):
    """Weights, Adam's moments, BatchNorm's statistics and the schedule go on as if never
    stopped (one fixed plan for both runs: a measured one may differ between them)."""
    full, part = tmp_path / "full", tmp_path / "part"
    fixed = ("--precision", "fp32", "--subset", "100")
    assert main(train_command(tiny_mnist_dir, full, "--epochs", "2", *fixed)) == 0
    assert main(train_command(tiny_mnist_dir, part, "--epochs", "1", *fixed)) == 0
    assert main(["train", "--resume", str(part), "--epochs", "2", "--no-progress"]) == 0
    resumed, uninterrupted = load_checkpoint(part / "last.pt"), load_checkpoint(full / "last.pt")
    assert resumed["epoch"] == 2 and resumed["model"] == "efficient"
    for name, tensor in uninterrupted["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], tensor, rtol=0, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")
    assert resumed["scheduler"] == uninterrupted["scheduler"]


@pytest.mark.slow  # with the fixture's training run
def test_evaluate_predict_and_export(full_run, tiny_mnist_dir, tmp_path, capsys):
    capsys.readouterr()
    assert main(["evaluate", str(full_run / "best.pt"), "--no-download",
                 "--data-dir", str(tiny_mnist_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    results = json.loads((full_run / "results.json").read_text())
    assert report["images"] == TEST_IMAGES
    assert report["accuracy"] == pytest.approx(results["best"]["accuracy"])

    image = Image.new("L", (200, 200), 255)
    ImageDraw.Draw(image).line([(100, 20), (100, 180)], fill=0, width=14)
    image.save(tmp_path / "one.png")
    assert main(["predict", str(tmp_path / "one.png"), "--checkpoint", str(full_run / "best.pt"),
                 "--json"]) == 0
    [result] = json.loads(capsys.readouterr().out)
    assert 0 <= result["digit"] <= 9 and len(result["lengths"]) == 10

    onnx_path = tmp_path / "efficient.onnx"
    pytest.importorskip("onnxscript")  # the ONNX exporter needs it (and onnx)
    assert main(["export", str(full_run / "best.pt"), "--format", "onnx", "-o",
                 str(onnx_path)]) == 0
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    model = model_from_checkpoint(full_run / "best.pt")
    images = torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    lengths, reconstructions = session.run(None, {"images": images.numpy()})
    with torch.no_grad():
        out = model(images)
    np.testing.assert_allclose(lengths, out.scores.numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(reconstructions, out.reconstructions.numpy(), atol=1e-5, rtol=0)


def test_routing_figure_draws_the_self_attention_couplings(full_run, tiny_mnist_dir, tmp_path,
                                                           capsys):
    """`capsnet routing` on a trained Efficient-CapsNet: its one pass of self-attention
    couplings C per primary capsule type (tests/test_routing_trace.py checks the trace)."""
    capsys.readouterr()
    out = tmp_path / "r.png"
    assert main(["routing", "--index", "0", "--checkpoint", str(full_run / "best.pt"),
                 "--no-download", "--data-dir", str(tiny_mnist_dir), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "1 routing iteration, " in text and "self-attention routing" in text
    assert out.is_file()


def test_conv_output_size_agrees_with_the_primary_grid():
    cfg = EfficientCapsNetConfig()
    side = cfg.image_size
    for kernel, stride in zip(cfg.conv_kernels, cfg.conv_strides, strict=True):
        side = conv_output_size(side, kernel, stride)
    assert side == cfg.feature_grid == 9


def test_the_paper_capsnet_routes_by_self_attention_when_asked():
    from capsnet.models import build_model, make_config
    model = build_model(make_config("capsnet", "small", routing="self-attention"))
    router = model.digit_caps.router
    assert router.name == "self-attention"
    assert router.b.shape == (model.config.num_classes, model.config.num_primary_caps)
    out = model(torch.rand(2, 1, 28, 28))
    assert out.scores.shape == (2, model.config.num_classes)
    assert torch.isfinite(out.scores).all() and (out.scores < 1).all()
