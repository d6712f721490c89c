"""Kernels and precision chosen by measurement: the selection logic with injected timings,
the per-machine cache, forced choices, and what a bf16 plan does to the model."""
from __future__ import annotations

import json

import pytest
import torch

from capsnet.models import CapsNet, CapsNetConfig, build_model, make_config
from capsnet.tuning import (
    INFERENCE_BATCH,
    SpeedPlan,
    apply_plan,
    choose_plan,
    conv_layers,
    current_plan,
    hardware,
    tune_for_inference,
)
from capsnet.tuning import cache as tuning_cache
from capsnet.tuning import plan as plan_module

CPU = torch.device("cpu")
TINY = CapsNetConfig(image_size=12, conv1_channels=8, conv1_kernel=3, primary_types=2,
                     primary_kernel=3, decoder_hidden=(16,))


class FakeTimings:
    """An injected measure: seconds per (layer, implementation, precision), and a count of
    the layers it was asked to time."""

    def __init__(self, table: dict):
        self.table, self.calls = table, []

    def __call__(self, name, impls, precision):
        self.calls.append((name, impls, precision))
        return {impl: self.table[(name, impl, precision)] for impl in impls}


def timings(fp32: dict, bf16: dict) -> dict:
    """{(layer, impl, precision): s} from {layer: {impl: s}} per precision."""
    return {(layer, impl, p): s for p, layers in (("fp32", fp32), ("bf16", bf16))
            for layer, row in layers.items() for impl, s in row.items()}


FAST_BF16 = timings(
    fp32={"conv1": {"gemm": 3.0, "native": 1.0, "channels_last": 2.0},
          "primary_caps.conv": {"gemm": 5.0, "native": 9.0, "channels_last": 8.0}},
    bf16={"conv1": {"gemm": 1.0, "native": 2.0, "channels_last": 0.5},
          "primary_caps.conv": {"gemm": 3.0, "native": 2.0, "channels_last": 4.0}})


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Each test starts with an empty cache of measured plans."""
    monkeypatch.setenv("CAPSNET_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def bf16_cpu(monkeypatch):
    monkeypatch.setattr(plan_module, "low_precisions", lambda device: ["bf16"])


def test_fastest_implementation_of_each_layer_and_precision_wins(bf16_cpu):
    measure = FakeTimings(FAST_BF16)
    plan = choose_plan(CapsNet(TINY), CPU, 128, measure=measure)
    assert plan.source == "measured"
    # bf16: conv1 0.5 + primary 2.0 = 2.5 s against fp32's 1.0 + 5.0 = 6.0 s
    assert plan.precision == "bf16"
    assert plan.conv_impls == {"conv1": "channels_last", "primary_caps.conv": "native"}
    assert plan.precision_totals() == {"fp32": 6.0, "bf16": 2.5}
    assert plan.timings["fp32"]["primary_caps.conv"]["gemm"] == 5.0
    assert [c[0] for c in measure.calls] == ["conv1", "primary_caps.conv"] * 2


class FakeTimingsInContext(FakeTimings):
    """Also whole-step timings: (layer, impl) -> seconds, recording the choices given."""

    def __init__(self, table: dict, steps: dict):
        super().__init__(table)
        self.steps, self.contexts = steps, []

    def in_context(self, name, impls, precision, choices):
        self.contexts.append((name, precision, dict(choices)))
        return {impl: self.steps[(name, impl)] for impl in impls}


def test_cheaper_layers_are_chosen_again_inside_whole_steps(bf16_cpu):
    """Alone, conv1 is fastest as channels_last; inside whole steps gemm wins: the plan
    takes gemm. The dominant layer (PrimaryCaps) keeps its own measurement."""
    steps = {("conv1", "gemm"): 0.40, ("conv1", "native"): 0.43, ("conv1", "channels_last"): 0.44}
    measure = FakeTimingsInContext(FAST_BF16, steps)
    plan = choose_plan(CapsNet(TINY), CPU, 128, measure=measure)
    assert measure.contexts == [("conv1", "bf16", {"conv1": "channels_last",
                                                   "primary_caps.conv": "native"})]
    assert plan.conv_impls == {"conv1": "gemm", "primary_caps.conv": "native"}
    assert plan.context_timings == {"conv1": {"gemm": 0.40, "native": 0.43,
                                              "channels_last": 0.44}}
    assert "conv1 in whole steps" in plan.describe()


def test_bf16_only_when_measurably_faster(bf16_cpu):
    table = dict(FAST_BF16)
    for (layer, impl, p) in list(table):
        if p == "bf16":  # bf16 only 5% faster than float32's best: not worth it
            table[(layer, impl, p)] = 0.95 * min(
                table[(layer, i, "fp32")] for i in ("gemm", "native", "channels_last"))
    plan = choose_plan(CapsNet(TINY), CPU, 128, measure=FakeTimings(table))
    assert plan.precision == "fp32"
    assert plan.conv_impls == {"conv1": "native", "primary_caps.conv": "gemm"}


def test_no_bf16_candidate_without_native_bf16(monkeypatch):
    monkeypatch.setattr(plan_module, "low_precisions", lambda device: [])
    measure = FakeTimings(FAST_BF16)
    plan = choose_plan(CapsNet(TINY), CPU, 128, measure=measure)
    assert plan.precision == "fp32" and {c[2] for c in measure.calls} == {"fp32"}


def test_a_cache_hit_skips_measuring_and_a_new_machine_measures_again(bf16_cpu, monkeypatch):
    model = CapsNet(TINY)
    first = choose_plan(model, CPU, 128, measure=FakeTimings(FAST_BF16))
    again = FakeTimings(FAST_BF16)
    cached = choose_plan(model, CPU, 128, measure=again)
    assert again.calls == [] and cached.source == "cache"
    assert (cached.precision, cached.conv_impls) == (first.precision, first.conv_impls)
    assert tuning_cache.cache_path().is_file()
    # another batch size, mode, thread count or CPU is another key: measured again
    for call in (lambda m: choose_plan(model, CPU, 64, measure=m),
                 lambda m: choose_plan(model, CPU, 128, mode="infer", measure=m)):
        measure = FakeTimings(FAST_BF16)
        assert call(measure).source == "measured" and measure.calls
    monkeypatch.setattr(plan_module, "machine_description",
                        lambda device: {**hardware.machine_description(device), "threads": 99})
    measure = FakeTimings(FAST_BF16)
    assert choose_plan(model, CPU, 128, measure=measure).source == "measured" and measure.calls


def test_a_stale_cache_entry_is_measured_again(bf16_cpu):
    model = CapsNet(TINY)
    choose_plan(model, CPU, 128, measure=FakeTimings(FAST_BF16))
    path = tuning_cache.cache_path()
    entries = json.loads(path.read_text())
    for entry in entries.values():  # as written by an older measurement
        entry["format"] = plan_module.PLAN_FORMAT - 1
    path.write_text(json.dumps(entries))
    measure = FakeTimings(FAST_BF16)
    assert choose_plan(model, CPU, 128, measure=measure).source == "measured" and measure.calls
    path.write_text("{not json")  # a damaged cache is measured again and rewritten
    assert choose_plan(model, CPU, 128, measure=FakeTimings(FAST_BF16)).source == "measured"
    assert choose_plan(model, CPU, 128, measure=FakeTimings(FAST_BF16)).source == "cache"


def test_forced_choices_are_obeyed(bf16_cpu):
    model = CapsNet(TINY)
    measure = FakeTimings(FAST_BF16)
    plan = choose_plan(model, CPU, 128, precision="fp32", conv_impl="gemm", measure=measure)
    assert measure.calls == [] and plan.source == "given"
    assert (plan.precision, set(plan.conv_impls.values())) == ("fp32", {"gemm"})
    # a forced path, precision still measured: only that path is timed
    measure = FakeTimings(FAST_BF16)
    plan = choose_plan(model, CPU, 128, conv_impl="gemm", measure=measure)
    assert {c[1] for c in measure.calls} == {("gemm",)}
    assert plan.precision == "bf16"  # gemm: bf16 4.0 s against fp32 8.0 s
    # a forced precision: only that precision is timed
    measure = FakeTimings(FAST_BF16)
    plan = choose_plan(model, CPU, 128, precision="fp32", measure=measure, use_cache=False)
    assert {c[2] for c in measure.calls} == {"fp32"} and plan.precision == "fp32"
    with pytest.raises(ValueError, match="unknown conv implementation"):
        choose_plan(model, CPU, 128, conv_impl="winograd")
    with pytest.raises(ValueError, match="unknown precision"):
        choose_plan(model, CPU, 128, precision="fp8")


def test_measuring_leaves_the_model_and_the_random_state_as_they_were():
    model = CapsNet(TINY)
    before = current_plan(model)
    rng = torch.get_rng_state()
    plan = choose_plan(model, CPU, 8, use_cache=False)  # real timings of the tiny model
    assert current_plan(model) == before and torch.equal(torch.get_rng_state(), rng)
    assert set(plan.conv_impls) == {"conv1", "primary_caps.conv"}
    assert plan.measure_seconds > 0 and plan.source == "measured"
    apply_plan(model, plan)
    assert current_plan(model).conv_impls == plan.conv_impls
    assert SpeedPlan.from_dict(json.loads(json.dumps(plan.as_dict()))) == plan
    assert "precision" in plan.describe()


def test_the_cnn_is_tuned_too_and_its_dropout_leaves_the_random_state_alone():
    cnn = build_model(make_config("cnn", "small"))
    assert [name for name, _ in conv_layers(cnn)] == ["features.0", "features.2", "features.4"]
    rng = torch.get_rng_state()
    plan = choose_plan(cnn, CPU, 8, precision="fp32", use_cache=False)
    assert torch.equal(torch.get_rng_state(), rng)  # whole steps ran dropout, on a forked RNG
    assert set(plan.conv_impls) == {"features.0", "features.2", "features.4"}
    assert plan.context_timings  # the cheaper layers were timed inside whole steps


def test_bf16_plan_keeps_routing_squash_and_outputs_in_float32():
    model = CapsNet(TINY)
    apply_plan(model, SpeedPlan("bf16", {"conv1": "gemm", "primary_caps.conv": "native"}))
    seen = {}
    model.digit_caps.router.register_forward_hook(
        lambda m, a, routed: seen.update(v=routed.poses.dtype))
    u, conv_out = {}, {}
    model.primary_caps.register_forward_hook(lambda m, a, out: u.update(u=out.dtype))
    model.primary_caps.conv.register_forward_hook(
        lambda m, a, out: conv_out.update(dtype=out.dtype))
    x = torch.rand(3, 1, 12, 12)
    out = model(x, torch.tensor([0, 1, 2]))
    assert conv_out["dtype"] == torch.bfloat16  # the convolution ran in bf16
    assert u["u"] == torch.float32 and seen["v"] == torch.float32  # squash and routing did not
    assert out.lengths.dtype == out.poses.dtype == out.reconstructions.dtype == torch.float32


def test_inference_plan_is_batch_invariant():
    """Under the inference plan (auto: bf16 where it pays) an image alone and the same image
    inside a batch of 64 get the same prediction and capsule lengths within 1e-3."""
    from capsnet.checkpoint import load_model

    model = load_model()  # the shipped paper-size model
    plan = tune_for_inference(model, CPU)
    assert plan.precision in ("fp32", "bf16")
    torch.manual_seed(0)
    images = torch.zeros(INFERENCE_BATCH, 1, 28, 28)
    for i in range(INFERENCE_BATCH):  # a stroke per image, at varied places
        images[i, 0, 6 + i % 12: 12 + i % 12, 8:20] = torch.rand(6, 12)
    with torch.no_grad():
        batch = model(images).lengths  # (64, 10)
        alone = torch.cat([model(images[i:i + 1]).lengths for i in range(0, INFERENCE_BATCH, 9)])
    torch.testing.assert_close(alone, batch[::9], rtol=0, atol=1e-3)
    assert torch.equal(alone.argmax(-1), batch[::9].argmax(-1))
