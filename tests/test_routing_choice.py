"""The routing algorithm as a model option: CapsNet with each router equals that router's
slow loop reference on fixed weights (outputs and gradients), the paper's default is dynamic
routing with 3 iterations and the shipped weights' keys, ``routing`` round-trips through
configs and checkpoints, and ``capsnet train --routing inverted-attention`` runs, saves,
resumes and rebuilds its router."""
from __future__ import annotations

import json

import pytest
import torch

from capsnet.checkpoint import (
    DEFAULT_WEIGHTS,
    load_checkpoint,
    load_model,
    model_from_checkpoint,
    save_checkpoint,
)
from capsnet.cli.main import main
from capsnet.config import config_to_dict
from capsnet.data.datasets import load_split
from capsnet.export import export_weights
from capsnet.layers import full_precision
from capsnet.losses import capsule_loss
from capsnet.models import (
    CapsNet,
    CapsNetConfig,
    ModelOutput,
    build_model,
    config_from_dict,
    count_parameters,
    make_config,
)
from capsnet.routing import DynamicRouter, InvertedAttentionRouter, Router, capsnet_routers
from capsnet.routing_trace import routing_trace
from tests.helpers_routing import reference_routing

PAPER_PARAMETERS = 8_215_568
PAPER_ITERATIONS = 3  # Sabour et al. 2017, section 4: "3 routing iterations"


def tiny_config(**overrides) -> CapsNetConfig:
    """A CapsNet of 16 primary capsules (12x12 inputs), small enough for the loop references."""
    return CapsNetConfig(image_size=12, conv1_channels=8, conv1_kernel=3, primary_types=1,
                         primary_kernel=3, decoder_hidden=(16,), **overrides)


def reference_forward(model: CapsNet, x: torch.Tensor, labels: torch.Tensor | None = None):
    """CapsNet's forward with its router replaced by that router's loop reference:
    Conv1 -> PrimaryCaps -> u_hat = W u -> reference routing -> lengths, poses, decoder."""
    h = torch.relu(model.conv1(model.input_norm(x)))  # (B, C, G, G)
    u = model.primary_caps(h)  # (B, I, 8)
    u_hat = model.digit_caps.predictions(full_precision(u))  # (B, J, I, 16)
    routed = reference_routing(model.digit_caps.router, u_hat)
    keep = labels if labels is not None else routed.activations.argmax(dim=-1)  # (B,)
    return ModelOutput(routed.activations, routed.poses, model.decoder(routed.poses, keep))


def routed_model(seed: int = 0, **overrides) -> CapsNet:
    """A float64 tiny CapsNet whose W is large enough that routing moves the couplings, and
    whose router parameters (if any) are not at their initial values."""
    torch.manual_seed(seed)
    model = CapsNet(tiny_config(**overrides)).double()
    with torch.no_grad():
        model.digit_caps.W.mul_(30)
        for p in model.digit_caps.router.parameters():
            p.copy_(0.3 * torch.randn_like(p) + (p == 1).to(p.dtype))
    return model


# ---- every router of CapsNet against its reference -----------------------------------------

@pytest.mark.parametrize("overrides", [
    *({"routing": name} for name in capsnet_routers()),
    {"routing": "dynamic", "none_of_the_above": True},
    {"routing": "dynamic", "routing_full_graph": True, "routing_iterations": 2},
    {"routing": "inverted-attention", "routing_iterations": 2},
], ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_capsnet_with_each_router_equals_the_routers_loop_reference(overrides):
    """Outputs (lengths, poses, reconstructions) and every parameter's gradient."""
    model = routed_model(**overrides)
    x, y = torch.rand(2, 1, 12, 12, dtype=torch.float64), torch.tensor([1, 7])
    got, want = model(x, y), reference_forward(model, x, y)
    for name in ("scores", "poses", "reconstructions"):
        a, b = getattr(got, name), getattr(want, name)
        torch.testing.assert_close(a, b, msg=name)
    capsule_loss(got, x, y).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    capsule_loss(want, x, y).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, msg=name)


def test_every_capsnet_router_has_a_reference():
    model = routed_model()
    for name in capsnet_routers():
        model.digit_caps.router = CapsNet(tiny_config(routing=name)).digit_caps.router
        reference_routing(model.digit_caps.router, torch.ones(1, 10, 2, 16))  # no TypeError


# ---- the paper model -----------------------------------------------------------------------

def test_the_paper_model_keeps_its_keys_parameters_and_router():
    """The paper's routing by default (dynamic, 3 iterations, gradients through the last
    only, no extra category); the state_dict's names are those of the shipped weights."""
    from safetensors import safe_open

    config = CapsNetConfig()
    assert (config.routing, config.routing_iterations) == ("dynamic", PAPER_ITERATIONS)
    model = CapsNet(config)
    router = model.digit_caps.router
    assert type(router) is DynamicRouter and router.iterations == PAPER_ITERATIONS
    assert not router.full_graph and not router.none_of_the_above
    with safe_open(str(DEFAULT_WEIGHTS), framework="pt") as shipped:
        assert sorted(model.state_dict()) == sorted(shipped.keys())
    assert "digit_caps.W" in model.state_dict()
    assert count_parameters(model) == PAPER_PARAMETERS


@pytest.mark.slow
def test_the_shipped_weights_route_as_procedure_1(mnist_dir):
    model = load_model()  # the shipped paper-size weights
    test = load_split("mnist", "test", mnist_dir, download=False)
    x = test.images[:2].float().div(255).unsqueeze(1)
    with torch.no_grad():
        got, want = model(x), reference_forward(model, x)
    for name in ("scores", "poses", "reconstructions"):
        a, b = getattr(got, name), getattr(want, name)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    assert torch.equal(got.scores.argmax(-1), test.labels[:2].long())


# ---- the config and checkpoints ------------------------------------------------------------

def test_routing_round_trips_and_configs_without_it_are_dynamic():
    config = make_config("capsnet", "small", routing="inverted-attention")
    values = config_to_dict(config)
    assert values["routing"] == "inverted-attention"
    assert config_from_dict("capsnet", values) == config
    del values["routing"]  # a config written before the field existed
    assert config_from_dict("capsnet", values).routing == "dynamic"
    with pytest.raises(ValueError, match="unknown option 'routing' for cnn"):
        make_config("cnn", "small", routing="dynamic")


def small_idpa(seed: int = 0) -> CapsNet:
    torch.manual_seed(seed)
    return build_model(make_config("capsnet", "small", routing="inverted-attention"))


def test_checkpoints_and_weights_rebuild_the_router(tmp_path):
    model = small_idpa().eval()
    path = tmp_path / "idpa.pt"
    save_checkpoint(path, model)
    loaded = model_from_checkpoint(path)
    assert isinstance(loaded.digit_caps.router, InvertedAttentionRouter)
    x = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        assert torch.equal(loaded(x).scores, model(x).scores)
    weights = load_model(export_weights(path, tmp_path / "idpa.safetensors"))
    assert weights.config.routing == "inverted-attention"

    old = load_checkpoint(path)  # a checkpoint from before routers: no 'routing', dynamic
    dynamic = build_model(make_config("capsnet", "small"))
    old["config"].pop("routing")
    old["state_dict"] = dynamic.state_dict()
    torch.save(old, path)
    assert isinstance(model_from_checkpoint(path).digit_caps.router, DynamicRouter)


# ---- a CapsNet routed by inverted attention ------------------------------------------------

def test_inverted_attention_capsnet_trains_every_parameter_and_scores_in_0_1():
    model = small_idpa()
    x, y = torch.rand(3, 1, 28, 28), torch.tensor([0, 4, 9])
    out = model(x, y)
    assert ((out.scores >= 0) & (out.scores < 1)).all()
    capsule_loss(out, x, y).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    extra = {"digit_caps.router.norm.weight", "digit_caps.router.norm.bias"}
    assert set(model.state_dict()) == set(build_model(make_config("capsnet", "small"))
                                          .state_dict()) | extra


def test_the_trace_shows_the_inverted_attention_couplings():
    model = small_idpa().eval()
    with torch.no_grad():
        model.digit_caps.W.mul_(30)
    images = torch.randint(0, 255, (2, 28, 28), dtype=torch.uint8)
    trace = routing_trace(model, images)
    with torch.no_grad():
        out = model(images.unsqueeze(1).float() / 255)
    assert trace.routing == "inverted-attention"
    assert torch.equal(trace.v, out.poses) and torch.equal(trace.scores, out.scores)
    R, J = model.config.routing_iterations, model.config.num_classes
    assert trace.couplings.shape[:3] == (2, R, J)
    assert torch.equal(trace.couplings[:, 0], torch.full_like(trace.couplings[:, 0], 1 / J))
    for r in range(1, R):  # Eq. 3: r(t + 1) = softmax over j of the agreements of t
        torch.testing.assert_close(trace.couplings[:, r],
                                   torch.softmax(trace.agreements[:, r - 1], dim=1))


def test_the_web_panel_names_the_router_and_a_trace_needs_no_agreements():
    from capsnet.web.app import routing_maps

    model = small_idpa().eval()
    image = torch.randint(0, 255, (1, 28, 28), dtype=torch.uint8).numpy()
    maps = routing_maps(model, image)
    assert maps["routing"] == "inverted-attention" and maps["first_uniform"]
    assert maps["uniform"] == pytest.approx(1 / model.config.num_classes)

    class Quiet(InvertedAttentionRouter):  # a router without Router.agreements
        name = "quiet"
        agreements = Router.agreements

    model.digit_caps.router = Quiet(model.config.digit_dim, 2)
    trace = routing_trace(model, torch.from_numpy(image))
    assert trace.agreements is None and trace.iterations == 2 and trace.routing == "quiet"


# ---- the command line ----------------------------------------------------------------------

@pytest.mark.slow
def test_cli_trains_saves_and_resumes_an_inverted_attention_capsnet(tiny_mnist_dir, tmp_path,
                                                                    capsys):
    run = tmp_path / "idpa"
    train = ["train", "--preset", "small", "--routing", "inverted-attention",
             "--no-download", "--data-dir", str(tiny_mnist_dir), "--val-size", "50",
             "--subset", "100", "--batch-size", "50", "--no-progress", "--out-dir", str(run)]
    assert main([*train, "--epochs", "1"]) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["settings"]["routing"] == saved["model_config"]["routing"] == \
        "inverted-attention"
    assert "--routing inverted-attention" in (run / "command.txt").read_text()

    assert main(["train", "--resume", str(run), "--epochs", "2", "--no-progress"]) == 0
    last = load_checkpoint(run / "last.pt")
    assert last["epoch"] == 2 and last["config"]["routing"] == "inverted-attention"
    model = model_from_checkpoint(run / "last.pt")
    assert isinstance(model.digit_caps.router, InvertedAttentionRouter)
    assert model.digit_caps.router.iterations == 3

    out = tmp_path / "routing.png"
    capsys.readouterr()
    assert main(["routing", "--checkpoint", str(run / "best.pt"), "--index", "0",
                 "--data-dir", str(tiny_mnist_dir), "--no-download", "--out", str(out)]) == 0
    assert "3 routing iterations" in capsys.readouterr().out and out.is_file()


def test_cli_refuses_an_unknown_routing(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--routing", "em-ish", "--out-dir", str(tmp_path)])
    assert "invalid choice: 'em-ish'" in capsys.readouterr().err
