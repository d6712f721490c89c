"""The speed plan's rule: bf16 where the device computes it natively, GEMM convolutions on
a CPU and cuDNN elsewhere; forced choices; and what a bf16 plan does to the model."""
from __future__ import annotations

import json

import pytest
import torch

import capsnet.tuning as plan_module
from capsnet.devices import has_native_bf16
from capsnet.models import CapsNet, CapsNetConfig, build_model, make_config
from capsnet.tuning import (
    SpeedPlan,
    apply_plan,
    choose_plan,
    conv_layers,
    current_plan,
    tune_for_inference,
)

CPU = torch.device("cpu")
TINY = CapsNetConfig(image_size=12, conv1_channels=8, conv1_kernel=3, primary_types=2,
                     primary_kernel=3, decoder_hidden=(16,))
INFERENCE_BATCH = 64


@pytest.mark.parametrize("capability, expected", [
    ((9, 0), True),  # H100
    ((8, 0), True),  # A100
    ((8, 6), True),  # RTX 30xx
    ((7, 5), False),  # T4, RTX 20xx
    ((7, 0), False),  # V100
])
def test_a_gpu_has_native_bf16_from_compute_capability_8(capability, expected):
    assert has_native_bf16("cuda", capability) is expected


def test_a_cpu_has_native_bf16_with_avx512_bf16_or_amx():
    assert has_native_bf16("cpu", cpu_flags=frozenset({"avx512_bf16", "avx2"}))
    assert has_native_bf16("cpu", cpu_flags=frozenset({"amx_bf16"}))
    assert not has_native_bf16("cpu", cpu_flags=frozenset({"avx512f"}))
    assert not has_native_bf16("mps")


@pytest.mark.parametrize("native, precision", [(True, "bf16"), (False, "fp32")])
def test_auto_on_a_cpu_is_gemm_and_bf16_where_native(monkeypatch, native, precision):
    monkeypatch.setattr(plan_module, "native_bf16", lambda device: native)
    plan = choose_plan(CapsNet(TINY), CPU)
    assert plan.precision == precision and plan.source == "rule"
    assert plan.conv_impls == {"conv1": "gemm", "primary_caps.conv": "gemm"}


def test_auto_on_a_gpu_is_cudnn_and_gemm_there_keeps_its_weight_layout(monkeypatch):
    monkeypatch.setattr(plan_module, "native_bf16", lambda device: True)
    monkeypatch.setattr(plan_module, "machine_description", lambda device: {"device": "cuda"})
    gpu = torch.device("cuda")
    plan = choose_plan(CapsNet(TINY), gpu)
    assert plan.precision == "bf16"
    assert set(plan.conv_impls.values()) == {"native"}
    assert set(choose_plan(CapsNet(TINY), gpu, conv_impl="gemm").conv_impls.values()) == {
        "channels_last"}  # no GEMM path on a GPU: PyTorch's, in the layout gemm keeps


def test_forced_choices_are_obeyed_and_bad_ones_name_the_choices():
    model = CapsNet(TINY)
    plan = choose_plan(model, CPU, precision="fp32", conv_impl="native")
    assert plan.precision == "fp32" and set(plan.conv_impls.values()) == {"native"}
    assert plan.source == "given"
    with pytest.raises(ValueError, match="conv implementation 'winograd'; choose from auto, gemm"):
        choose_plan(model, CPU, conv_impl="winograd")
    with pytest.raises(ValueError, match="unknown precision 'fp8'; choose from auto, fp32"):
        choose_plan(model, CPU, precision="fp8")


def test_a_plan_applies_round_trips_and_leaves_the_model_alone_until_applied():
    model = CapsNet(TINY)
    before = current_plan(model)
    plan = choose_plan(model, CPU, precision="bf16", conv_impl="channels_last")
    assert current_plan(model) == before  # choosing changes nothing
    apply_plan(model, plan)
    assert current_plan(model).conv_impls == plan.conv_impls
    assert model.compute_dtype == torch.bfloat16
    assert SpeedPlan.from_dict(json.loads(json.dumps(plan.as_dict()))) == plan
    old = {**plan.as_dict(), "timings": {}, "measure_seconds": 3.0, "source": "measured"}
    assert SpeedPlan.from_dict(old).conv_impls == plan.conv_impls  # older checkpoints' plans
    assert plan.describe().startswith("precision bf16; convolutions: conv1 channels_last")


def test_the_cnns_convolutions_are_in_the_plan_too():
    cnn = build_model(make_config("cnn", "small"))
    assert [name for name, _ in conv_layers(cnn)] == ["features.0", "features.2", "features.4"]
    assert set(choose_plan(cnn, CPU).conv_impls) == {"features.0", "features.2", "features.4"}


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
    assert out.scores.dtype == out.poses.dtype == out.reconstructions.dtype == torch.float32


def test_inference_plan_is_batch_invariant():
    """Under the inference plan (auto: bf16 where native) an image alone and the same image
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
        batch = model(images).scores  # (64, 10)
        alone = torch.cat([model(images[i:i + 1]).scores for i in range(0, INFERENCE_BATCH, 9)])
    torch.testing.assert_close(alone, batch[::9], rtol=0, atol=1e-3)
    assert torch.equal(alone.argmax(-1), batch[::9].argmax(-1))


@pytest.mark.parametrize("native, dtype", [(True, torch.bfloat16), (False, None)])
def test_capsnet_tune_makes_a_model_of_ones_own_compute_as_train_does(monkeypatch, native,
                                                                       dtype):
    import capsnet

    monkeypatch.setattr(plan_module, "native_bf16", lambda device: native)
    monkeypatch.setattr(plan_module, "tune_backends", lambda device: None)  # process-wide
    model = capsnet.create_model("capsnet-small")
    plan = capsnet.tune(model)  # on the device of its parameters
    assert model.compute_dtype == dtype and plan.source == "rule"
    assert {name: conv.impl for name, conv in conv_layers(model)} == plan.conv_impls == {
        "conv1": "gemm", "primary_caps.conv": "gemm"}
    assert plan.describe().startswith(f"precision {'bf16' if native else 'fp32'}")
