"""The EM capsule network (Hinton, Sabour & Frosst 2018): its layers against loops, the
model's sizes, shapes, gradients and precision, the spread loss and its margin schedule,
checkpoints, export, memory and speed plan, and `--model em` end to end on tiny data."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from capsnet.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from capsnet.cli.main import main
from capsnet.config import config_to_dict
from capsnet.layers.matrix_caps import (
    COLUMN_SLOT,
    POSE_SIDE,
    ROW_SLOT,
    ClassCapsules,
    ConvMatrixCaps,
    window_children,
)
from capsnet.losses import model_loss, spread_loss, spread_margin
from capsnet.models import (
    MODELS,
    EMCapsNet,
    EMCapsNetConfig,
    ModelOutput,
    build_model,
    class_scores,
    config_from_dict,
    count_parameters,
    make_config,
    model_name_of,
)
from capsnet.models.em_capsnet import PRIMARY_POSE_RMS
from capsnet.training import loop
from capsnet.training.fit import ClassifyTask
from capsnet.training.optimisation import build_training, initialise_from_data
from capsnet.training.settings import FAST_RECIPE, TrainSettings
from capsnet.tuning import choose_plan

EM_LR = MODELS["em"].lr

# Narrow layers with the paper's structure: a forward and backward pass in well under a second.
TINY = EMCapsNetConfig(conv1_channels=8, primary_types=4, caps1_types=4, caps2_types=4)


def images(batch: int, config: EMCapsNetConfig = TINY, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(batch, config.in_channels, config.image_size, config.image_size,
                      generator=g)


# ----------------------------------------------------------------------------------------
# Layers against loops
# ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("grid, kernel, stride", [(5, 3, 1), (6, 3, 2)])
def test_window_children_against_loops(grid, kernel, stride):
    types = 2
    index = window_children(grid, kernel, stride, types)
    out = (grid - kernel) // stride + 1
    expected = [[((y * stride + ky) * grid + x * stride + kx) * types + t
                 for ky in range(kernel) for kx in range(kernel) for t in range(types)]
                for y in range(out) for x in range(out)]
    assert index.tolist() == expected


def test_conv_caps_votes_are_each_childs_pose_times_its_transformation():
    in_types, out_types, kernel, grid = 2, 3, 3, 4
    layer = ConvMatrixCaps(in_types, out_types, kernel, 1, grid)
    poses = torch.randn(2, grid, grid, in_types, POSE_SIDE**2)
    V = layer.votes(poses)  # (B, J, K, 16)
    out = grid - kernel + 1
    assert V.shape == (2, out * out * out_types, kernel * kernel * in_types, POSE_SIDE**2)
    for y in range(out):
        for x in range(out):
            for c in range(out_types):
                j = (y * out + x) * out_types + c
                for k, (ky, kx, t) in enumerate((ky, kx, t) for ky in range(kernel)
                                                for kx in range(kernel)
                                                for t in range(in_types)):
                    M = poses[:, y + ky, x + kx, t].view(2, POSE_SIDE, POSE_SIDE)
                    expected = (M @ layer.W[k, c]).reshape(2, -1)
                    torch.testing.assert_close(V[:, j, k], expected)


def test_class_capsules_share_transformations_and_add_coordinates():
    in_types, classes, coordinates = 2, 3, (0.1, 0.5, 0.9)
    layer = ClassCapsules(in_types, classes, coordinates)
    G = len(coordinates)
    poses = torch.randn(2, G, G, in_types, POSE_SIDE**2)
    V = layer.votes(poses)  # (B, classes, G*G*in_types, 16)
    assert V.shape == (2, classes, G * G * in_types, POSE_SIDE**2)
    for row in range(G):
        for col in range(G):
            for t in range(in_types):
                i = (row * G + col) * in_types + t
                M = poses[:, row, col, t].view(2, POSE_SIDE, POSE_SIDE)
                for j in range(classes):
                    expected = (M @ layer.W[t, j]).reshape(2, -1).clone()
                    expected[:, ROW_SLOT] += coordinates[row]  # (row 0, last column)
                    expected[:, COLUMN_SLOT] += coordinates[col]  # (row 1, last column)
                    torch.testing.assert_close(V[:, j, i], expected)
    assert (ROW_SLOT, COLUMN_SLOT) == (3, 7)


def test_coordinates_are_the_scaled_centres_of_the_receptive_fields():
    """28x28: Conv1 5x5/2 -> 12, ConvCaps1 3x3/2 -> 5, ConvCaps2 3x3/1 -> 3. ConvCaps2 row 0
    sees ConvCaps1 rows 0-2 (centre 1), which see Conv1 rows 2-4 (centre 3), which see
    pixels 6-10 (centre 8); rows 1 and 2 are 4 pixels further each."""
    config = EMCapsNetConfig()
    assert (config.conv1_grid, config.caps1_grid, config.caps2_grid) == (12, 5, 3)
    assert config.class_coordinates == pytest.approx([8.5 / 28, 12.5 / 28, 16.5 / 28])
    assert config.smallest_image_size == 17
    EMCapsNetConfig(image_size=17)  # 7, 3, 1
    with pytest.raises(ValueError, match="smallest workable size is 17"):
        EMCapsNetConfig(image_size=16)


# ----------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------

def expected_parameters(A: int, B: int, C: int, D: int, classes: int = 10, pixels_in: int = 1,
                        kernel: int = 5, window: int = 9) -> int:
    pose = POSE_SIDE**2
    return ((kernel * kernel * pixels_in + 1) * A  # Conv1 weights and biases
            + (A + 1) * B * (pose + 1)  # PrimaryCaps: 16 pose units and 1 activation per type
            + window * B * C * pose + 2 * C  # ConvCaps1: W per (offset, type in, type out); betas
            + window * C * D * pose + 2 * D  # ConvCaps2
            + D * classes * pose + 2 * classes)  # class capsules: W per (type, class); betas


def test_paper_and_small_sizes_and_their_parameter_counts():
    paper, small = make_config("em", "paper"), make_config("em", "small")
    assert (paper.conv1_channels, paper.primary_types, paper.caps1_types,
            paper.caps2_types) == (32, 32, 32, 32)
    assert (small.conv1_channels, small.primary_types, small.caps1_types,
            small.caps2_types) == (64, 8, 16, 16)
    assert count_parameters(build_model(paper)) == expected_parameters(32, 32, 32, 32) == 318_964
    assert count_parameters(build_model(small)) == expected_parameters(64, 8, 16, 16) == 68_444
    with pytest.raises(ValueError, match="unknown preset 'cifar10' for em; choose from paper"):
        make_config("em", "cifar10")


def test_forward_shapes_and_every_parameter_gets_a_gradient():
    torch.manual_seed(0)
    model = EMCapsNet(TINY)
    x, y = images(3), torch.tensor([1, 5, 9])
    out = model(x, y)
    assert out.loss == "spread" and out.reconstructions is None
    assert out.scores.shape == (3, 10) and out.poses.shape == (3, 10, 16)
    assert out.scores.dtype == torch.float32
    assert ((out.scores > 0) & (out.scores < 1)).all()
    assert class_scores(out) is out.scores
    model_loss(out, x, y).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_batch_of_one_and_eval_are_deterministic():
    model = EMCapsNet(TINY).eval()
    x = images(2)
    with torch.no_grad():
        both = model(x).scores
        one = model(x[:1]).scores
    torch.testing.assert_close(one, both[:1])


def test_bf16_autocast_keeps_the_routing_in_float32():
    torch.manual_seed(0)
    model = EMCapsNet(TINY).eval()
    x = images(2)
    with torch.no_grad():
        expected = model(x)
        model.compute_dtype = torch.bfloat16  # as a speed plan sets it
        out = model(x)
    assert out.scores.dtype == out.poses.dtype == torch.float32
    assert torch.isfinite(out.scores).all()
    torch.testing.assert_close(out.scores, expected.scores, atol=2e-2, rtol=0)


def test_many_training_steps_stay_finite():
    """Adam at ten times the default rate on noise: nothing becomes NaN or infinite."""
    torch.manual_seed(0)
    model = EMCapsNet(TINY)
    optimizer = torch.optim.Adam(model.parameters(), lr=10 * EM_LR)
    for step in range(40):
        x, y = images(4, seed=step), torch.randint(0, 10, (4,))
        loss = model_loss(model(x, y), x, y, run_fraction=step / 40)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        assert torch.isfinite(loss)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_checkpoint_round_trip(tmp_path):
    torch.manual_seed(0)
    model = EMCapsNet(TINY).eval()
    assert model_name_of(TINY) == "em"
    assert config_from_dict("em", json.loads(json.dumps(config_to_dict(TINY)))) == TINY
    save_checkpoint(tmp_path / "em.pt", model)
    assert load_checkpoint(tmp_path / "em.pt")["model"] == "em"
    loaded = model_from_checkpoint(tmp_path / "em.pt")
    assert isinstance(loaded, EMCapsNet) and loaded.config == TINY
    x = images(2)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).scores, model(x).scores)


def test_onnx_export_matches_pytorch(tmp_path):
    pytest.importorskip("onnxscript")  # the ONNX exporter needs it (and onnx)
    ort = pytest.importorskip("onnxruntime")
    from capsnet.export import export_model, read_description

    torch.manual_seed(0)
    model = EMCapsNet(TINY).eval()
    path = export_model(model, tmp_path / "em.onnx", "onnx")
    assert read_description(path)["outputs"] == ["activations"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3  # shape-inference notes on the scatter's expanded index
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for batch in (3, 1):
        x = images(batch, seed=batch)
        [activations] = session.run(None, {"images": x.numpy()})
        with torch.no_grad():
            np.testing.assert_allclose(activations, model(x).scores.numpy(), atol=1e-4)


# ----------------------------------------------------------------------------------------
# The spread loss
# ----------------------------------------------------------------------------------------

def test_spread_loss_hand_computed():
    a = torch.tensor([[0.9, 0.5, 0.1], [0.2, 0.6, 0.7]])
    targets = torch.tensor([0, 1])
    # example 0: (0.5 - 0.4)^2 + 0 ; example 1: (0.5 - 0.4)^2 + (0.5 + 0.1)^2
    expected = (0.01 + (0.01 + 0.36)) / 2
    assert spread_loss(a, targets, margin=0.5).item() == pytest.approx(expected)
    assert spread_loss(torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([0]), 0.9).item() == 0.0


def test_spread_margin_grows_linearly_from_0_2_to_0_9():
    assert spread_margin(0.0) == pytest.approx(0.2)
    assert spread_margin(0.5) == pytest.approx(0.55)
    assert spread_margin(1.0) == spread_margin(3.0) == pytest.approx(0.9)
    assert spread_margin(-1.0) == pytest.approx(0.2)


def test_model_loss_chooses_the_spread_loss_for_matrix_capsules():
    a = torch.tensor([[0.3, 0.6, 0.4]])
    y = torch.tensor([0])
    out = ModelOutput(a, torch.zeros(1, 3, 16), loss="spread")
    x = torch.zeros(1, 1, 28, 28)
    torch.testing.assert_close(model_loss(out, x, y), spread_loss(a, y, 0.9))
    torch.testing.assert_close(model_loss(out, x, y, run_fraction=0.0), spread_loss(a, y, 0.2))


def test_the_training_loop_grows_the_margin_over_the_run(monkeypatch):
    fractions = []
    real_loss = loop.model_loss

    def recording_loss(*args, run_fraction=1.0, **kwargs):
        fractions.append(run_fraction)
        return real_loss(*args, run_fraction=run_fraction, **kwargs)

    monkeypatch.setattr(loop, "model_loss", recording_loss)
    model = EMCapsNet(TINY)
    optimizer = torch.optim.Adam(model.parameters())
    pixels = torch.randint(0, 256, (8, 28, 28), dtype=torch.uint8)
    options = loop.StepOptions(batch_size=2, max_shift=0, run_span=(0.5, 0.75))
    loop.train_one_epoch(model, optimizer, pixels, torch.arange(8) % 10, torch.arange(8), options)
    assert fractions == pytest.approx([0.5, 0.5625, 0.625, 0.6875])


# ----------------------------------------------------------------------------------------
# Memory estimate, speed plan, learning rate
# ----------------------------------------------------------------------------------------

def test_speed_plan_tunes_the_two_convolutions():
    plan = choose_plan(EMCapsNet(TINY), torch.device("cpu"), precision="fp32")
    assert plan.conv_impls == {"conv1": "gemm", "primary_caps.conv": "gemm"}


def test_default_learning_rate_is_the_authors():
    assert EM_LR == 3e-3
    assert TrainSettings(model="em").lr == EM_LR
    # the fast recipe peaks at EM's own rate, not 3x it (em_capsnet.ENTRY.recipes says why)
    fast = TrainSettings(model="em", recipe="fast")
    assert fast.lr == pytest.approx(EM_LR)
    assert (fast.epochs, fast.schedule, fast.warmup_epochs, fast.min_lr, fast.ema_decay) == (
        FAST_RECIPE["epochs"], "cosine", FAST_RECIPE["warmup_epochs"], FAST_RECIPE["min_lr"],
        FAST_RECIPE["ema_decay"])


# ----------------------------------------------------------------------------------------
# The command line end to end on the tiny fake MNIST (conftest.tiny_mnist_dir)
# ----------------------------------------------------------------------------------------

def train_command(data_dir: Path, out_dir: Path, *extra: str) -> list[str]:
    return ["train", "--model", "em", "--preset", "small", "--no-download", "--data-dir",
            str(data_dir), "--val-size", "50", "--subset", "100", "--batch-size", "50",
            "--precision", "fp32", "--no-progress", "--out-dir",
            str(out_dir), *extra]


def digit_png(path: Path) -> Path:
    image = Image.new("L", (120, 120), 255)
    ImageDraw.Draw(image).line([(60, 15), (60, 105)], fill=0, width=10)  # a "1"
    image.save(path)
    return path


@pytest.mark.slow
def test_cli_train_resume_evaluate_predict_export(tiny_mnist_dir, tmp_path, capsys):
    run = tmp_path / "em-run"
    assert main(train_command(tiny_mnist_dir, run, "--epochs", "1")) == 0
    assert "initialised from data: primary pose units scaled" in capsys.readouterr().out
    config = json.loads((run / "config.json").read_text())
    assert config["settings"]["model"] == "em" and config["settings"]["lr"] == EM_LR
    assert config["model_config"]["caps1_types"] == 16
    assert main(train_command(tiny_mnist_dir, run, "--epochs", "2", "--resume", str(run))) == 0
    assert "initialised from data" not in capsys.readouterr().out  # the checkpoint's weights
    results = json.loads((run / "results.json").read_text())
    assert results["complete"] and results["epochs"] == 2
    rows = (run / "metrics.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 2  # header, epochs 1 and 2 (the second resumed)
    assert isinstance(model_from_checkpoint(run / "last.pt"), EMCapsNet)

    capsys.readouterr()
    assert main(["evaluate", str(run / "last.pt"), "--no-download", "--data-dir",
                 str(tiny_mnist_dir), "--json", "--device", "cpu"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert 0.0 <= report["accuracy"] <= 1.0

    png = digit_png(tmp_path / "one.png")
    assert main(["predict", str(png), "--checkpoint", str(run / "last.pt"), "--json",
                 "--device", "cpu"]) == 0
    [prediction] = json.loads(capsys.readouterr().out)
    assert 0 <= prediction["digit"] <= 9 and len(prediction["lengths"]) == 10

    exported = tmp_path / "em.pt2"
    assert main(["export", str(run / "last.pt"), "--format", "pt2", "-o",
                 str(exported)]) == 0
    assert exported.is_file()


def primary_poses(model: EMCapsNet, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return model.primary_caps(torch.relu(model.conv1(model.input_norm(images))))


def test_initialise_from_data_gives_unit_scale_poses_and_keeps_activations():
    torch.manual_seed(0)
    model = build_model(make_config("em", "small"))
    images = torch.rand(16, 1, 28, 28)
    poses_before, activations_before = primary_poses(model, images)
    described = model.initialise_from_data(images)
    poses, activations = primary_poses(model, images)
    rms_before = poses_before.pow(2).mean().sqrt().item()
    assert poses.pow(2).mean().sqrt().item() == pytest.approx(PRIMARY_POSE_RMS, rel=1e-5)
    # a pure rescaling of the pose units: same directions, activations untouched
    torch.testing.assert_close(poses, poses_before * (PRIMARY_POSE_RMS / rms_before))
    torch.testing.assert_close(activations, activations_before)
    assert f"{PRIMARY_POSE_RMS / rms_before:.3g}" in described


def test_a_fresh_run_initialises_from_its_training_images_and_the_ema_follows(tiny_mnist_dir):
    settings = TrainSettings(model="em", preset="small", data_dir=str(tiny_mnist_dir),
                             download=False, device="cpu", epochs=1, ema_decay=0.9,
                             progress=False, precision="fp32")
    task = ClassifyTask(settings)
    task.prepare(torch.device("cpu"))
    assert task.epoch_size == len(task.train_idx)  # per-step schedules count on it
    training = build_training(settings, task.model_overrides(), torch.device("cpu"))
    images = task.initialisation_images()
    assert images.shape[1:] == (1, 28, 28) and 0.0 <= images.min() <= images.max() <= 1.0
    assert "scaled by" in initialise_from_data(training, images)
    poses, _ = primary_poses(training.model, images)
    assert poses.pow(2).mean().sqrt().item() == pytest.approx(PRIMARY_POSE_RMS, rel=1e-5)
    for name, tensor in training.model.state_dict().items():  # the average starts from it
        torch.testing.assert_close(training.ema.module.state_dict()[name], tensor)
    # models without a data-dependent step are left alone
    settings_cnn = TrainSettings(model="cnn", preset="tiny", data_dir=str(tiny_mnist_dir),
                                 download=False, device="cpu", progress=False)
    cnn = build_training(settings_cnn, task.model_overrides(), torch.device("cpu"))
    assert initialise_from_data(cnn, images) is None
