"""The full-strength attacks on tiny trained models: the log-odds and DLR losses, the
worst-case ensemble, APGD, Square's per-image squares, the reconstructive grid's choice,
and adversarial training's batches. References are written out by hand."""
from __future__ import annotations

import pytest
import torch

from capsnet.attacks import AttackSettings, Objective, attack_loss, predict, run_attack
from capsnet.attacks.methods import P_INIT, apgd, pgd, square_linf
from capsnet.attacks.objectives import ENSEMBLE_LOSSES, ensemble_losses, log_odds_scores
from capsnet.attacks.registry import least_detectable
from capsnet.attacks.training import adversarial_batch
from capsnet.models import ModelOutput
from tests.attack_models import ATTACK_IMAGES, trained

N = ATTACK_IMAGES  # the `data` fixture's images


def fooled(model, x_adv, y) -> torch.Tensor:
    return predict(model, x_adv) != y


def in_ball(x, x_adv, eps) -> bool:
    return bool(((x_adv - x).abs() <= eps + 1e-6).all() and x_adv.min() >= 0
                and x_adv.max() <= 1)


def test_log_odds_undo_the_squash_flatness_near_a_confident_length():
    # at L = 0.93 the cw margin on lengths moves the true class by 1 per unit of L; on the
    # log-odds by 1 / (L (1 - L)) ~ 15
    lengths = torch.tensor([[0.93, 0.30, 0.02]], requires_grad=True)
    output = ModelOutput(lengths, torch.zeros(1, 3, 2))
    labels = torch.tensor([0])
    grads = {}
    for name in ("cw", "logodds-cw"):
        grads[name], = torch.autograd.grad(attack_loss(name)(output, labels).sum(), lengths)
    assert grads["cw"][0, 0] == pytest.approx(-1.0)
    assert grads["logodds-cw"][0, 0] == pytest.approx(-1 / (0.93 * 0.07), rel=1e-4)
    expected = torch.log(torch.tensor(0.3 / 0.7)) - torch.log(torch.tensor(0.93 / 0.07))
    assert attack_loss("logodds-cw")(output, labels).item() == pytest.approx(expected.item(),
                                                                             rel=1e-5)


def test_dlr_by_hand_and_log_odds_of_a_cnn_are_its_logits():
    logits = torch.tensor([[3.0, 1.0, 2.0, -1.0]])
    output = ModelOutput.from_logits(logits)
    assert torch.equal(log_odds_scores(output), logits)
    # DLR = (best other - true) / (z_pi1 - z_pi3) = (2 - 3) / (3 - 1)
    assert attack_loss("dlr")(output, torch.tensor([0])).item() == pytest.approx(-0.5)
    # true class second: (3 - 2) / (3 - 1)
    assert attack_loss("dlr")(output, torch.tensor([2])).item() == pytest.approx(0.5)


def test_the_ensemble_runs_the_log_odds_losses_once_on_a_cnn(capsnet, cnn, data):
    x, y = data
    with torch.no_grad():
        assert ensemble_losses("worst", capsnet(x), y) == ENSEMBLE_LOSSES
        assert ensemble_losses("worst", cnn(x), y) == ("logodds-ce", "logodds-cw", "dlr")
        assert ensemble_losses("cw", cnn(x), y) == ("cw",)


@pytest.mark.parametrize("model_name", ["capsnet", "cnn"])
def test_worst_case_fools_every_image_its_first_loss_fools(model_name, capsnet, cnn, data):
    model = {"capsnet": capsnet, "cnn": cnn}[model_name]
    x, y = data
    eps = 0.15
    first, _ = run_attack("pgd", model, x, y, eps, AttackSettings(steps=10,
                                                                 loss=ENSEMBLE_LOSSES[0]))
    worst, _ = run_attack("pgd", model, x, y, eps, AttackSettings(steps=10))
    assert in_ball(x, worst, eps)
    assert (fooled(model, worst, y) >= fooled(model, first, y)).all()


@pytest.mark.parametrize("model_name", ["capsnet", "cnn"])
def test_apgd_stays_in_the_ball_and_is_no_weaker_than_fgsm(model_name, capsnet, cnn, data):
    model = {"capsnet": capsnet, "cnn": cnn}[model_name]
    x, y = data
    eps = 0.2
    objective = Objective(model, y, attack_loss("logodds-ce"))
    x_apgd = apgd(objective, x, eps, steps=20, generator=torch.Generator().manual_seed(0))
    x_fgsm = pgd(objective, x, eps, steps=1, step_size=eps, random_init=False)
    assert in_ball(x, x_apgd, eps)
    assert fooled(model, x_apgd, y).sum() >= fooled(model, x_fgsm, y).sum()
    x_big = apgd(objective, x, 1.0, steps=20, generator=torch.Generator().manual_seed(0))
    assert fooled(model, x_big, y).all()


def test_apgd_halves_its_step_on_a_loss_that_never_rises(data):
    # a constant loss: no step is a rise, so every checkpoint halves the step and the run
    # returns to its best point, the start: the images stay where the random start put them
    x, y = data

    class Flat(Objective):
        def __call__(self, images):
            return images.sum(dim=(1, 2, 3)) * 0, torch.zeros(len(images), dtype=torch.bool)

    objective = Flat(None, y, attack_loss("cw"))
    start = apgd(objective, x, 0.1, steps=1, generator=torch.Generator().manual_seed(3))
    longer = apgd(objective, x, 0.1, steps=30, generator=torch.Generator().manual_seed(3))
    assert torch.equal(start, longer)


def test_square_stays_in_the_ball_and_fools_a_cnn(cnn, data):
    x, y = data
    eps = 0.3
    objective = Objective(cnn, y, attack_loss("logodds-cw"))
    x_adv = square_linf(objective, x, eps, queries=200,
                        generator=torch.Generator().manual_seed(0))
    assert in_ball(x, x_adv, eps)
    assert fooled(cnn, x_adv, y).float().mean() > 0.5


def test_square_draws_a_square_per_image_of_the_initial_fraction(data):
    x, y = data
    calls = []

    class Rising(Objective):  # every candidate raises the loss: each query is kept
        def __call__(self, images):
            calls.append(images.clone())
            return (torch.full((len(images),), float(len(calls))),
                    torch.zeros(len(images), dtype=torch.bool))

    square_linf(Rising(None, y, attack_loss("cw")), x, 0.3, queries=1,
                generator=torch.Generator().manual_seed(0))
    start, first = calls  # the stripes, then the first query's candidates
    changed = (first - start).abs().sum(dim=1) > 0  # (N, H, W)
    boxes = {(int(c.any(1).nonzero().min()), int(c.any(0).nonzero().min()))
             for c in changed if c.any()}
    assert len(boxes) > 1  # the squares sit in different places
    side = round((P_INIT * 28 * 28) ** 0.5)  # 25 of 28 pixels
    assert int(changed.any(dim=1).sum(dim=1).max()) <= side


def test_least_detectable_keeps_the_fooling_candidate_with_the_smallest_error(capsnet, data):
    x, y = data
    loud, _ = run_attack("pgd", capsnet, x, y, 1.0, AttackSettings(steps=10))
    quiet = x.clone()  # not fooling (mostly), with a small reconstruction error
    chosen = least_detectable(capsnet, x, y, [quiet, loud], targeted=False)
    fools_loud = fooled(capsnet, loud, y) & ~fooled(capsnet, quiet, y)
    assert torch.equal(chosen[fools_loud], loud[fools_loud])
    # with two fooling candidates, the one the decoder reconstructs better wins
    both = least_detectable(capsnet, x, y, [loud, loud * 0 + loud.flip(0)], targeted=False)
    assert both.shape == x.shape


def test_reconstructive_attack_with_a_grid_runs_and_stays_in_the_ball(capsnet, data):
    x, y = data
    settings = AttackSettings(steps=5, loss="logodds-ce", reconstruction_weights=(0.0, 1.0))
    x_adv, _ = run_attack("reconstructive", capsnet, x, y, 0.2, settings)
    plain, _ = run_attack("pgd", capsnet, x, y, 0.2, AttackSettings(steps=5,
                                                                    loss="logodds-ce"))
    assert in_ball(x, x_adv, 0.2)
    # weight 0 is the plain attack: the grid fools at least what it fools
    assert fooled(capsnet, x_adv, y).sum() >= fooled(capsnet, plain, y).sum()


@pytest.mark.parametrize("kind", ["fgsm-rs", "pgd"])
def test_adversarial_batches_stay_in_the_ball_and_leave_parameters_alone(kind, data):
    model = trained("cnn")
    model.train().requires_grad_(True).zero_grad(set_to_none=True)
    x, y = data
    eps = 0.3
    x_adv = adversarial_batch(model, x, y, kind, eps, steps=5,
                              generator=torch.Generator().manual_seed(0))
    assert in_ball(x, x_adv, eps) and not x_adv.requires_grad
    assert all(p.grad is None for p in model.parameters())
    model.eval()
    assert fooled(model, x_adv, y).float().mean() > fooled(model, x, y).float().mean()


def test_adversarial_batch_names_the_choices(data):
    x, y = data
    with pytest.raises(ValueError, match="choose from fgsm-rs, pgd"):
        adversarial_batch(trained("cnn"), x, y, "trades", 0.1)

