"""--recipe official: the released code's schedule and training set, and each of its model
differences as an option that is off by default (the paper model stays as it was)."""
from __future__ import annotations

import pytest
import torch

from capsnet.config import ConfigError
from capsnet.losses import capsule_loss, margin_loss
from capsnet.models.base import ModelOutput
from capsnet.models.capsnet import CapsNet, CapsNetConfig
from capsnet.routing.dynamic import RELEASED_BIAS_INIT, DynamicRouter
from capsnet.training.optimisation import make_scheduler
from capsnet.training.settings import (
    OFFICIAL_RECIPE,
    RELEASED_DECAY,
    RELEASED_DECAY_STEPS,
    RELEASED_STEPS,
    RELEASED_STEPS_PER_EPOCH,
    TrainSettings,
)

PAPER_PARAMETERS = 8_215_568


def released_rate(step: int) -> float:
    """tf.train.exponential_decay(1e-3, step, 2000, 0.96) floored at 1e-6 (model.py)."""
    return max(1e-3 * RELEASED_DECAY ** (step / RELEASED_DECAY_STEPS), 1e-6)


def test_schedule_is_the_released_one_stepped_per_epoch():
    assert RELEASED_STEPS_PER_EPOCH == 469  # 60,000 images in batches of 128
    s = TrainSettings(recipe="official")
    assert (s.batch_size, s.lr, s.min_lr, s.val_size, s.max_shift) == (128, 1e-3, 1e-6, 0, 2)
    assert s.epochs == 640 and s.epochs * RELEASED_STEPS_PER_EPOCH >= RELEASED_STEPS
    optimizer = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=s.lr)
    scheduler = make_scheduler(optimizer, s, RELEASED_STEPS_PER_EPOCH)
    schedule = scheduler.lr_lambdas[0]
    for epoch in (0, 1, 10, 100, 639):
        step = epoch * RELEASED_STEPS_PER_EPOCH
        for within in (0, RELEASED_STEPS_PER_EPOCH - 1):  # the epoch's start's rate throughout
            assert s.lr * schedule(step + within) == pytest.approx(released_rate(step), rel=1e-9)
    last = s.lr * schedule(RELEASED_STEPS)
    assert 2.0e-6 < last < 2.4e-6  # "down to about 2e-6", above the 1e-6 floor


def test_recipe_turns_on_the_released_model_options_and_halves_the_margin_loss():
    s = TrainSettings(recipe="official")
    assert s.margin_weight == 0.5
    assert s.model_options() == {"routing_full_graph": True, "routing_biases": True,
                                 "digit_weights_stddev": 0.1}
    given = TrainSettings(recipe="official", routing_biases=False)  # each one can be left off
    assert given.model_options()["routing_biases"] is False
    assert OFFICIAL_RECIPE["model_options"]["digit_weights_stddev"] == 0.1


def test_other_recipes_and_models_keep_their_defaults():
    s = TrainSettings()
    assert s.margin_weight == 1.0 and s.val_size is None and s.model_options() == {}
    cnn = TrainSettings(model="cnn", recipe="official")  # the CapsNet options do not apply
    assert "routing_biases" not in cnn.model_options() and cnn.epochs == 640


def test_paper_model_is_unchanged_by_default():
    torch.manual_seed(0)
    paper = CapsNet(CapsNetConfig())
    assert sum(p.numel() for p in paper.parameters()) == PAPER_PARAMETERS
    assert paper.digit_caps.router.bias is None


def test_released_weights_are_the_same_draw_at_std_0_1():
    torch.manual_seed(0)
    paper = CapsNet(CapsNetConfig(use_decoder=False))
    torch.manual_seed(0)
    released = CapsNet(CapsNetConfig(use_decoder=False, digit_weights_stddev=0.1))
    torch.testing.assert_close(released.digit_caps.W, 10 * paper.digit_caps.W)
    assert released.digit_caps.W.std().item() == pytest.approx(0.1, rel=0.01)
    with pytest.raises(ValueError, match="digit_weights_stddev"):
        CapsNetConfig(digit_weights_stddev=0.0)


def test_routing_biases_are_added_before_every_squash():
    model = CapsNet(CapsNetConfig(routing_biases=True))
    assert sum(p.numel() for p in model.parameters()) == PAPER_PARAMETERS + 10 * 16
    router = DynamicRouter(3, biases=(2, 4))
    assert torch.equal(router.bias, torch.full((2, 4), RELEASED_BIAS_INIT))
    with torch.no_grad():
        router.bias.copy_(torch.arange(8.0).view(2, 4))
    u_hat = torch.zeros(1, 2, 5, 4)  # (B, J, I, D): no votes, so s is the bias alone
    v, _, _ = router.route(u_hat)
    expected = router.bias / router.bias.norm(dim=-1, keepdim=True)
    expected = expected * (router.bias.norm(dim=-1, keepdim=True) ** 2
                           / (1 + router.bias.norm(dim=-1, keepdim=True) ** 2))
    torch.testing.assert_close(v[0], expected.detach())
    (model(torch.rand(2, 1, 28, 28), torch.tensor([1, 2])).scores.sum()).backward()
    assert model.digit_caps.router.bias.grad.abs().sum() > 0  # it trains


def test_routing_biases_need_a_router_that_takes_them():
    with pytest.raises(ConfigError, match="routing_biases"):
        TrainSettings(routing="inverted-attention", routing_biases=True)


def test_margin_weight_halves_only_the_margin_loss():
    lengths = torch.tensor([[0.2, 0.7, 0.05], [0.95, 0.3, 0.6]])  # (B, J)
    labels = torch.tensor([1, 0])
    recon, images = torch.rand(2, 1, 4, 4), torch.rand(2, 1, 4, 4)
    out = ModelOutput(lengths, torch.zeros(2, 3, 16), recon)
    whole = capsule_loss(out, images, labels, 0.0005)
    halved = capsule_loss(out, images, labels, 0.0005, margin_weight=0.5)
    torch.testing.assert_close(whole - halved, 0.5 * margin_loss(lengths, labels))
    # the released form: 0.5 x present + 0.25 x absent
    present = ((0.9 - 0.7) ** 2 + 0.0) / 2
    absent = 0.5 * ((0.2 - 0.1) ** 2 + (0.3 - 0.1) ** 2 + (0.6 - 0.1) ** 2) / 2
    assert 0.5 * margin_loss(lengths, labels).item() == pytest.approx(
        0.5 * present + 0.5 * absent)


def test_the_training_step_takes_the_recipes_margin_weight():
    from types import SimpleNamespace

    from capsnet.training.runner import Task

    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig(conv1_channels=32, primary_types=8, decoder_hidden=(64, 128)))
    batch = (torch.rand(2, 1, 28, 28), torch.tensor([4, 9]))  # (B, 1, 28, 28), (B,)
    losses = {}
    for recipe in ("paper", "official"):
        task = SimpleNamespace(settings=TrainSettings(recipe=recipe))
        losses[recipe] = Task.batch_loss(task, model, batch, 1.0)[0]
    with torch.no_grad():
        out = model(*batch)
    margin = margin_loss(out.scores, batch[1])
    torch.testing.assert_close(losses["paper"] - losses["official"], 0.5 * margin)
