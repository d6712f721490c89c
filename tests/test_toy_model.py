"""A model added through the registry alone: a toy capsule network declared here, one
line in MODELS, then trained by `capsnet train`, saved, loaded, used for prediction,
traced and exported with no other change to capsnet."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import nn

from capsnet.checkpoint import load_model
from capsnet.cli.main import main
from capsnet.config import DataConfig
from capsnet.export import export_model, read_description
from capsnet.inference import predict_prepared
from capsnet.layers import DigitCaps, squash
from capsnet.models import MODELS, ModelOutput, make_config
from capsnet.models.base import TYPE_MAJOR, Children, ClassRouting, ModelEntry
from capsnet.routing import DynamicRouter
from capsnet.routing_trace import routing_trace
from tests.conftest import make_fake_digits

TRAIN_IMAGES = 600


@dataclass(frozen=True)
class ToyConfig(DataConfig):
    primary_caps: int = 6
    primary_dim: int = 4
    class_dim: int = 8
    routing_iterations: int = 2


class ToyCapsNet(nn.Module):
    """Pixels -> one linear map to primary capsules -> DigitCaps with dynamic routing.
    Input (B, C, H, W); output ModelOutput, scores (B, J), no reconstructions."""

    def __init__(self, config: ToyConfig):
        super().__init__()
        cfg = self.config = config
        self.primary = nn.Linear(cfg.num_pixels, cfg.primary_caps * cfg.primary_dim)
        self.class_caps = DigitCaps(cfg.primary_caps, cfg.primary_dim, cfg.num_classes,
                                    cfg.class_dim, DynamicRouter(cfg.routing_iterations))
        self.compute_dtype: torch.dtype | None = None

    def forward_routing(self, x: torch.Tensor) -> ClassRouting:
        u = squash(self.primary(x.flatten(1)).unflatten(1, (self.config.primary_caps, -1)))
        votes, routed = self.class_caps.route(u)  # (B, J, I, D), Routed
        return ClassRouting(u, votes, None, routed, self.class_caps.router)

    def forward_head(self, routing: ClassRouting, labels=None) -> ModelOutput:
        return ModelOutput(routing.routed.activations, routing.routed.poses)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> ModelOutput:
        return self.forward_head(self.forward_routing(x), labels)


def toy_view(config: ToyConfig) -> Children:
    """Every primary capsule sees the whole image: types on a 1x1 grid."""
    return Children(config.primary_caps, 1, TYPE_MAJOR, [(config.image_size - 1) / 2],
                    config.image_size, "primary", "length")


ENTRY = ModelEntry(name="toy", config=ToyConfig, model=ToyCapsNet, summary="a toy capsule net",
                   presets={"paper": {}, "wide": {"primary_caps": 12}}, lr=1e-2,
                   routing_view=toy_view)


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setitem(MODELS, "toy", ENTRY)  # the one line a new model adds


def test_a_toy_model_added_through_the_registry_trains_saves_loads_predicts_traces_exports(
        toy_registered, tiny_mnist_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--model", "toy", "--preset", "wide", "--routing-iterations", "3",
                 "--data-dir", str(tiny_mnist_dir), "--no-download", "--epochs", "3",
                 "--val-size", "100", "--batch-size", "32", "--precision", "fp32",
                 "--conv-impl", "gemm", "--out-dir", str(run), "--no-progress"]) == 0
    model = load_model(run / "best.pt")
    assert isinstance(model, ToyCapsNet)
    assert model.config == make_config("toy", "wide", routing_iterations=3, num_classes=10,
                                       class_names=model.config.class_names)
    assert model.class_caps.router.iterations == 3

    images, labels = make_fake_digits(40, seed=3)
    predictions = predict_prepared(model, images, [f"bar {i}" for i in range(len(images))])
    accuracy = sum(p.index == int(y) for p, y in zip(predictions, labels, strict=True)) / 40
    assert accuracy > 0.5  # chance is 0.1: the toy learnt the bars

    trace = routing_trace(model, torch.from_numpy(images[:4]))
    assert trace.couplings.shape == (4, 3, 10, 12) and trace.grid == 1
    torch.testing.assert_close(trace.scores, model(torch.from_numpy(images[:4]).float()
                                                    .unsqueeze(1) / 255).scores)

    path = export_model(model, tmp_path / "toy.pt2", "pt2")
    described = read_description(path)
    assert described["model"] == "toy" and described["outputs"] == ["lengths"]


def test_a_toy_option_the_toy_does_not_have_is_refused_on_the_command_line(
        toy_registered, tiny_mnist_dir, tmp_path, capsys):
    code = main(["train", "--model", "toy", "--routing", "inverted-attention",
                 "--data-dir", str(tiny_mnist_dir), "--out-dir", str(tmp_path / "no")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not (tmp_path / "no").exists()
    assert err == ("capsnet: error: --routing is not an option of --model toy (only of "
                   "--model capsnet, capshead)")
    assert len(err.splitlines()) == 1
