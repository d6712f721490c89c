"""Attacks, detectors, OOD scores and the evaluation sanity checks on tiny trained models
(seconds on a CPU). References are written out by hand: FGSM's one step, the vote mean
from the model's own layers, AUROC by counting pairs."""
from __future__ import annotations

import pytest
import torch

from capsnet.attacks import AttackSettings, Objective, attack_loss, predict, run_attack
from capsnet.attacks.capsule import diagnosis, primary_votes, vote_output
from capsnet.attacks.detection import (
    DETECTION_FPR,
    auroc,
    detection_metrics,
    fit_detector,
    fit_detectors,
    image_scores,
)
from capsnet.attacks.methods import cw_l2, pgd, project, square_linf, within_radius
from capsnet.attacks.objectives import ATTACK_LOSSES, prepare_for_attack
from capsnet.attacks.ood import CORRUPTIONS, ood_row
from capsnet.attacks.runner import sanity_checks
from capsnet.models import ModelOutput, build_model, make_config
from capsnet.routing import capsnet_routers
from capsnet.squashing import squash
from tests.attack_models import ATTACK_IMAGES, TINY_CAPSNET, fake_digits, trained

N = ATTACK_IMAGES  # the `data` fixture's images
SATURATION_THRESHOLD = 0.5  # fake digits made binary, as MNIST nearly is
SATURATED_RADIUS = 4.0  # L2: where PGD-L2 fools some of the binary digits


def fooled_share(model, x_adv, y) -> float:
    return float((predict(model, x_adv) != y).float().mean())


# ---- losses ---------------------------------------------------------------------------

def test_margin_loss_is_flat_on_confident_outputs_and_cw_is_not():
    lengths = torch.tensor([[0.95, 0.05, 0.02]], requires_grad=True)
    labels = torch.tensor([0])
    output = ModelOutput(lengths, torch.zeros(1, 3, 2))
    for name, flat in (("margin", True), ("cw", False), ("ce", False)):
        grad, = torch.autograd.grad(attack_loss(name)(output, labels).sum(), lengths)
        assert (grad.abs().sum() == 0) == flat, name
    cw = attack_loss("cw")(output, labels)
    assert torch.allclose(cw, torch.tensor([0.05 - 0.95]))
    targeted, _ = Objective(lambda x: output, torch.tensor([1]), attack_loss("cw"),
                            targeted=True)(torch.zeros(1))
    assert torch.allclose(targeted, torch.tensor([0.05 - 0.95]))


def test_unknown_loss_and_attack_name_the_choices(capsnet, data):
    with pytest.raises(ValueError, match="choose from worst, cw, margin, ce, logodds-ce"):
        attack_loss("hinge")
    with pytest.raises(ValueError, match="choose from fgsm"):
        run_attack("deepfool", capsnet, *data, 0.1)


# ---- gradient attacks ---------------------------------------------------------------

def test_fgsm_is_one_signed_step_of_the_loss_gradient(cnn, data):
    x, y = data
    x_req = x.clone().requires_grad_(True)
    loss = attack_loss("ce")(cnn(x_req), y).sum()
    grad, = torch.autograd.grad(loss, x_req)
    expected = (x + 0.1 * grad.sign()).clamp(0, 1)
    got, _ = run_attack("fgsm", cnn, x, y, 0.1, AttackSettings(loss="ce"))
    assert torch.allclose(got, expected)


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_pgd_stays_in_the_ball_and_in_the_pixel_range(capsnet, data, norm):
    x, y = data
    eps = 0.1 if norm == "linf" else 1.0
    x_adv = pgd(Objective(capsnet, y, attack_loss("cw")), x, eps, steps=5, norm=norm,
                generator=torch.Generator().manual_seed(0))
    delta = (x_adv - x).flatten(1)
    size = delta.abs().amax(1) if norm == "linf" else delta.norm(dim=1)
    assert (size <= eps + 1e-5).all() and x_adv.min() >= 0 and x_adv.max() <= 1
    far = project(torch.randn_like(x) * 10, eps, norm).flatten(1)  # (N, 784), all outside
    far_size = far.abs().amax(1) if norm == "linf" else far.norm(dim=1)
    assert torch.allclose(far_size, torch.full((N,), eps), atol=1e-5)


@pytest.mark.parametrize("model_name", ["capsnet", "cnn"])
def test_pgd_at_large_eps_fools_every_image(model_name, capsnet, cnn, data):
    model = capsnet if model_name == "capsnet" else cnn
    x, y = data
    x_adv, _ = run_attack("pgd", model, x, y, 0.5, AttackSettings(steps=20, restarts=5))
    assert fooled_share(model, x_adv, y) == 1.0


def test_margin_loss_stalls_where_cw_does_not(capsnet, data):
    """The paper's margin loss has zero gradient on confident images: PGD cannot move
    them from a zero start (no random start: BIM)."""
    x, y = data
    confident = attack_loss("margin")(capsnet(x), y) == 0  # true > 0.9, others < 0.1
    assert confident.any()
    stalled, _ = run_attack("bim", capsnet, x[confident], y[confident], 0.3,
                            AttackSettings(steps=5, loss="margin"))
    moved, _ = run_attack("bim", capsnet, x[confident], y[confident], 0.3,
                          AttackSettings(steps=5, loss="cw"))
    assert torch.equal(stalled, x[confident])
    assert not torch.equal(moved, x[confident])


def test_targeted_pgd_reaches_its_targets(cnn, data):
    x, y = data
    x_adv, targets = run_attack("pgd", cnn, x, y, 0.6, AttackSettings(steps=30, targeted=True))
    assert (targets != y).all()
    assert float((predict(cnn, x_adv) == targets).float().mean()) >= 0.9


def test_every_loss_works_on_every_model(capsnet, cnn, data):
    x, y = data
    for model in (capsnet, cnn):
        for loss in ATTACK_LOSSES:
            x_adv, _ = run_attack("pgd", model, x[:4], y[:4], 0.05,
                                  AttackSettings(steps=2, loss=loss))
            assert x_adv.shape == x[:4].shape and torch.isfinite(x_adv).all()


def test_attacks_run_in_float32_with_gradients_through_every_routing_iteration():
    model = build_model(make_config("capsnet", **TINY_CAPSNET))
    model.compute_dtype = torch.bfloat16
    prepare_for_attack(model)
    assert model.compute_dtype is None and not model.training
    assert all(m.full_graph for m in model.modules() if hasattr(m, "full_graph"))
    assert not any(p.requires_grad for p in model.parameters())


# ---- C&W, Square ----------------------------------------------------------------------

def test_cw_finds_small_perturbations_that_fool(cnn, data):
    x, y = data
    objective = Objective(cnn, y, attack_loss("cw"))
    x_adv = cw_l2(objective, x, steps=30, search_steps=3)
    found = predict(cnn, x_adv) != y
    assert found.float().mean() >= 0.8
    norms = (x_adv - x).flatten(1).norm(dim=1)
    pgd_l2, _ = run_attack("pgd-l2", cnn, x, y, float(norms[found].max()) * 2,
                           AttackSettings(steps=20))
    assert fooled_share(cnn, pgd_l2, y) >= found.float().mean() - 0.1
    kept = within_radius(x, x_adv, float(norms[found].median()))
    assert ((kept - x).flatten(1).norm(dim=1) <= float(norms[found].median()) + 1e-5).all()


def test_cw_moves_saturated_pixels_and_is_no_weaker_than_pgd_l2(capsnet, data):
    # Pixels at exactly 0 or 1 (most of an MNIST digit): in tanh space their gradient
    # vanishes and C&W found nothing here; in pixel space it must match PGD-L2's radius.
    x, y = data
    x = (x > SATURATION_THRESHOLD).float()  # (N, 1, 28, 28) every pixel 0 or 1
    x_adv = cw_l2(Objective(capsnet, y, attack_loss("cw")), x)  # the default budget
    pgd_l2, _ = run_attack("pgd-l2", capsnet, x, y, SATURATED_RADIUS,
                           AttackSettings(steps=40, loss="cw"))  # the same loss as C&W
    pgd_fooled = predict(capsnet, pgd_l2) != y
    cw_fooled = (predict(capsnet, x_adv) != y) & \
        ((x_adv - x).flatten(1).norm(dim=1) <= SATURATED_RADIUS)
    assert pgd_fooled.any()  # the radius is one where the comparison means something
    assert cw_fooled.sum() >= pgd_fooled.sum()


def test_square_is_gradient_free_and_stays_in_the_ball(capsnet, data):
    x, y = data

    class NoGradients(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.config = inner, inner.config

        def forward(self, x, labels=None):
            assert not torch.is_grad_enabled()
            return self.inner(x, labels)
    objective = Objective(NoGradients(capsnet), y, attack_loss("cw"))
    runs = {q: square_linf(objective, x, 0.3, queries=q,
                           generator=torch.Generator().manual_seed(0)) for q in (1, 50)}
    assert (runs[50] - x).abs().max() <= 0.3 + 1e-6
    with torch.no_grad():
        short, long = objective(runs[1])[0], objective(runs[50])[0]
    assert (long >= short).all() and long.mean() > short.mean()  # it only ever climbs


# ---- capsule attacks --------------------------------------------------------------------

def test_votes_are_the_capsule_layers_own_predictions(capsnet, data):
    x, _ = data
    u_hat, output = primary_votes(capsnet, x)
    with torch.no_grad():
        u = capsnet.primary_caps(torch.relu(capsnet.conv1(capsnet.input_norm(x))))
        expected = torch.einsum("ijdk,bik->bjid", capsnet.digit_caps.W, u)
    assert torch.allclose(u_hat, expected, atol=1e-5)
    surrogate = vote_output(capsnet, x)
    J = expected.shape[1]
    s = expected.sum(dim=2) / J  # uniform couplings 1/J: the first routing iteration's s
    assert torch.allclose(surrogate.scores, squash(s).norm(dim=-1), atol=1e-5)
    assert torch.equal(surrogate.scores.argmax(-1),
                       squash(expected.mean(dim=2)).norm(dim=-1).argmax(-1))
    assert torch.equal(surrogate.reconstructions, output.reconstructions)


@pytest.mark.parametrize("routing", capsnet_routers())
def test_vote_attack_works_for_each_router(routing, data):
    model = prepare_for_attack(build_model(make_config("capsnet", **TINY_CAPSNET,
                                                       routing=routing)))
    x, y = data
    x_adv, _ = run_attack("vote", model, x[:4], y[:4], 0.3, AttackSettings(steps=3))
    assert not torch.equal(x_adv, x[:4])


def test_vote_attack_refuses_models_without_votes(cnn, data):
    with pytest.raises(ValueError, match="needs a capsule model"):
        run_attack("vote", cnn, *data, 0.1)


def test_reconstructive_attack_keeps_the_reconstruction_error_lower(capsnet, data):
    x, y = data
    plain, _ = run_attack("pgd", capsnet, x, y, 0.3, AttackSettings(steps=10))
    careful, _ = run_attack("reconstructive", capsnet, x, y, 0.3,
                            AttackSettings(steps=10, reconstruction_weights=(1.0,)))
    error = {name: image_scores(capsnet, images)[0]["reconstruction"].mean()
             for name, images in (("plain", plain), ("careful", careful))}
    assert error["careful"] < error["plain"]


def test_diagnosis_gives_reconstructions_for_both_classes(capsnet, data):
    x, y = data
    x_adv, _ = run_attack("pgd", capsnet, x[:3], y[:3], 0.5, AttackSettings(steps=10))
    view = diagnosis(capsnet, x[:3], x_adv, y[:3])
    assert view["clean_reconstruction_true"].shape == x[:3].shape
    assert not torch.equal(view["adversarial_reconstruction_true"],
                           view["adversarial_reconstruction_adversarial"])


# ---- detection ----------------------------------------------------------------------------

def test_auroc_counts_pairs():
    neg, pos = torch.tensor([0.1, 0.4, 0.35]), torch.tensor([0.8, 0.4])
    pairs = [(p > n) + 0.5 * (p == n) for p in pos.tolist() for n in neg.tolist()]
    assert auroc(neg, pos) == pytest.approx(sum(pairs) / len(pairs))
    assert auroc(pos, neg) == pytest.approx(1 - auroc(neg, pos))


def test_thresholds_flag_five_percent_of_validation_images():
    scores = torch.arange(1000, dtype=torch.float32)
    predictions = torch.arange(1000) % 10
    for name in ("reconstruction", "class-reconstruction"):
        detector = fit_detector(name, scores, predictions, 10)
        share = float((detector.normalised(scores, predictions) > 0).float().mean())
        assert share == pytest.approx(DETECTION_FPR, abs=0.01)
    per_class = fit_detector("class-reconstruction", scores, predictions, 10).thresholds
    overall = fit_detector("reconstruction", scores, predictions, 10).thresholds
    assert len(per_class.unique()) == 10 and len(overall.unique()) == 1
    with pytest.raises(ValueError, match="choose from reconstruction"):
        fit_detector("entropy", scores, predictions, 10)


def test_detection_metrics_by_hand():
    detector = fit_detector("length", torch.linspace(0, 1, 101),
                            torch.zeros(101, dtype=torch.long), 1)
    clean = (torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.zeros(4, dtype=torch.long))
    adv = (torch.tensor([0.99, 0.5, 0.98, 0.2]), torch.zeros(4, dtype=torch.long))
    attacked = torch.tensor([True, True, True, False])
    fooled = torch.tensor([True, True, False, True])
    m = detection_metrics(detector, clean, adv, attacked, fooled)
    assert m["S_f"] == pytest.approx(2 / 3)  # two of the three attacked images fooled
    assert m["S_d"] == pytest.approx(1 / 3)  # one of them (score 0.5) not flagged
    assert m["tpr"] == pytest.approx(0.5)
    assert m["auroc"] == pytest.approx(1.0)


def test_detectors_fit_on_a_model_and_catch_large_attacks(capsnet, cnn, data):
    x_val, _ = fake_digits(100, seed=3)
    caps_detectors = fit_detectors(capsnet, x_val)
    assert [d.name for d in caps_detectors] == ["reconstruction", "class-reconstruction",
                                                "length", "margin"]
    assert [d.name for d in fit_detectors(cnn, x_val)] == ["length", "margin"]


# ---- out of distribution -----------------------------------------------------------------

def test_corruptions_keep_shape_and_range_and_change_the_images(data):
    x, _ = data
    for name, corrupt in CORRUPTIONS.items():
        shifted = corrupt(x, torch.Generator().manual_seed(0))
        assert shifted.shape == x.shape and shifted.min() >= 0 and shifted.max() <= 1, name
        assert not torch.allclose(shifted, x), name
    flat = torch.full((1, 1, 28, 28), 0.5)
    assert torch.allclose(CORRUPTIONS["blur"](flat)[..., 10:18, 10:18], flat[..., 10:18, 10:18])


def test_ood_row_scores_noise_as_out_of_distribution(capsnet, data):
    x, _ = data
    detectors = fit_detectors(capsnet, fake_digits(100, seed=3)[0])
    row = ood_row("tiny", capsnet, detectors, x, "noise", torch.rand_like(x))
    assert row["auroc"]["reconstruction"] > 0.9


# ---- sanity checks --------------------------------------------------------------------------

def test_sanity_checks_pass_on_a_tiny_model_with_a_transfer_source(capsnet, cnn, data):
    x, y = data
    rows = sanity_checks(capsnet, x, y, 0.3, AttackSettings(steps=10, queries=30), source=cnn)
    assert {r["check"] for r in rows} >= {"iterative <= single step",
                                          "unbounded attack reaches 100%",
                                          "transfer <= white-box",
                                          "more restarts never help the defence"}
    failed = [r for r in rows if not r["passed"]]
    assert not failed, failed


def test_sanity_checks_catch_a_masked_gradient(data):
    """A model whose input gradient is zero (its input is rounded with a detached
    straight-through of nothing) defeats PGD but not Square: the check reports masking."""
    base = trained("cnn")

    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.config = base, base.config

        def forward(self, x, labels=None):
            return self.inner(x.detach())  # no gradient reaches the input
    x, y = data
    rows = {r["check"]: r for r in sanity_checks(Masked(), x, y, 0.3,
                                                 AttackSettings(steps=5, queries=100))}
    assert not rows["gradient-free no stronger than PGD (else masking)"]["passed"]
    assert not rows["unbounded attack reaches 100%"]["passed"]


# ---- CNN baselines with a decoder (Qin et al. 2020) -----------------------------------------

def test_cnn_decoders_leave_the_plain_cnn_unchanged_and_reconstruct(data):
    x, y = data
    plain = build_model(make_config("cnn", "tiny"))
    torch.manual_seed(0)
    with_r = build_model(make_config("cnn", "tiny", decoder="plain"))
    assert set(plain.state_dict()) < set(with_r.state_dict())
    assert all(k.startswith("decoder.") for k in set(with_r.state_dict()) - set(plain.state_dict()))
    with_r.load_state_dict({**with_r.state_dict(), **plain.state_dict()})
    plain.eval(), with_r.eval()
    out = with_r(x)
    assert torch.equal(out.logits, plain(x).logits)
    assert out.reconstructions.shape == x.shape
    cr = build_model(make_config("cnn", "tiny", decoder="class-conditional")).eval()
    assert not torch.allclose(cr(x, y).reconstructions, cr(x, (y + 1) % 10).reconstructions)
    with pytest.raises(ValueError, match="choose from none, plain, class-conditional"):
        make_config("cnn", decoder="conditional")


def test_cnn_cr_trains_with_the_reconstruction_loss_and_gets_reconstruction_detectors(data):
    from capsnet.losses import model_loss

    x, y = data
    model = trained("cnn", decoder="class-conditional")
    out = model(x, y)
    ce = torch.nn.functional.cross_entropy(out.logits, y)
    assert model_loss(out, x, y) > ce
    assert float((predict(model, x) == y).float().mean()) == 1.0
    names = [d.name for d in fit_detectors(model, fake_digits(100, seed=3)[0])]
    assert names[:2] == ["reconstruction", "class-reconstruction"]
    x_adv, _ = run_attack("reconstructive", model, x[:4], y[:4], 0.3, AttackSettings(steps=3))
    assert not torch.equal(x_adv, x[:4])


def test_routing_gradient_last_keeps_the_training_graph_and_the_outputs(data):
    x, _ = data
    torch.manual_seed(0)
    model = build_model(make_config("capsnet", **TINY_CAPSNET))
    full = prepare_for_attack(model)
    with torch.no_grad():
        full_out = full(x).scores
    last = prepare_for_attack(model, full_routing_gradient=False)
    assert not any(m.full_graph for m in last.modules() if hasattr(m, "full_graph"))
    with torch.no_grad():
        assert torch.equal(last(x).scores, full_out)


@pytest.mark.parametrize("model_name", ["capsnet", "cnn", "efficient", "em"])
def test_input_gradients_reach_every_model(model_name, data):
    """Every model gives a non-zero input gradient in float32 (no detached path), and the
    vote attack runs on Efficient-CapsNet's capsule layer too."""
    torch.manual_seed(0)
    model = prepare_for_attack(build_model(make_config(model_name, "small")))
    x, y = data
    x = x[:2].clone().requires_grad_(True)
    loss, _ = Objective(model, y[:2], attack_loss("cw"))(x)
    grad, = torch.autograd.grad(loss.sum(), x)
    assert loss.dtype == torch.float32 and grad.abs().sum() > 0
    if model_name == "efficient":
        x_adv, _ = run_attack("vote", model, x.detach(), y[:2], 0.1, AttackSettings(steps=2))
        assert not torch.equal(x_adv, x.detach())
