"""The decisions of capsnet's CUDA branches, run on a CPU: each depends on plain values (a
device type, a compute capability, a LOCAL_RANK, a saved RNG state), so a test gives it the
values a GPU machine would. No GPU is needed; what still needs one is listed in the notes
of issue 25 (docs)."""
from __future__ import annotations

import pytest
import torch

import capsnet.tuning.plan as plan_module
from capsnet.devices import backend_flags, check_cuda_device
from capsnet.models import CapsNet, CapsNetConfig
from capsnet.training.distributed import cuda_index_for
from capsnet.tuning import choose_plan
from capsnet.tuning.hardware import describe_machine, native_low_precisions
from capsnet.tuning.timing import (
    CPU_SCHEDULE,
    TimingSchedule,
    contenders,
    interleaved_medians,
    timing_schedule,
    warm_up_calls,
)

CPU = torch.device("cpu")
TINY = CapsNetConfig(image_size=12, conv1_channels=8, conv1_kernel=3, primary_types=2,
                     primary_kernel=3, decoder_hidden=(16,))


# --- which precisions a device is timed in --------------------------------------------------

@pytest.mark.parametrize("capability, expected", [
    ((9, 0), ["bf16"]),  # H100
    ((8, 0), ["bf16"]),  # A100
    ((8, 6), ["bf16"]),  # RTX 30xx
    ((7, 5), ["fp16"]),  # T4, RTX 20xx: no native bf16, fp16 tensor cores
    ((7, 0), ["fp16"]),  # V100
    ((6, 1), []),  # GTX 10xx: neither pays
])
def test_gpu_precision_candidates_follow_the_compute_capability(capability, expected):
    assert native_low_precisions("cuda", capability) == expected


def test_cpu_precision_candidates_follow_the_cpu_flags():
    assert native_low_precisions("cpu", cpu_flags=frozenset({"avx512_bf16", "avx2"})) == ["bf16"]
    assert native_low_precisions("cpu", cpu_flags=frozenset({"amx_bf16"})) == ["bf16"]
    assert native_low_precisions("cpu", cpu_flags=frozenset({"avx512f"})) == []
    assert native_low_precisions("mps") == []


def fp16_timings(fp16_factor: float) -> dict:
    """Timings of a T4-like GPU: no gemm path; fp16 ``fp16_factor`` times float32's time."""
    fp32 = {"conv1": {"native": 1.0, "channels_last": 2.0},
            "primary_caps.conv": {"native": 9.0, "channels_last": 8.0}}
    table = {}
    for layer, row in fp32.items():
        for impl, seconds in row.items():
            table[(layer, impl, "fp32")] = seconds
            table[(layer, impl, "fp16")] = fp16_factor * seconds
    return table


@pytest.mark.parametrize("factor, expected", [(0.5, "fp16"), (0.95, "fp32")])
def test_a_gpu_without_bf16_trains_in_fp16_only_where_it_is_faster(monkeypatch, factor, expected):
    """On an sm_75 GPU (T4) --precision auto times fp16 against float32 and takes fp16 only
    when its convolutions are at least 10% faster; the 16-bit precision is timed first."""
    monkeypatch.setattr(plan_module, "low_precisions", lambda device: ["fp16"])
    monkeypatch.setattr(plan_module, "machine_description", lambda device: {"device": "cuda"})
    calls = []

    def measure(name, impls, precision):
        calls.append((name, precision))
        assert "gemm" not in impls  # no CPU-only path on a GPU
        return {impl: fp16_timings(factor)[(name, impl, precision)] for impl in impls}

    model = CapsNet(TINY)
    plan = choose_plan(model, torch.device("cuda"), 128, measure=measure, use_cache=False)
    assert plan.precision == expected
    assert [p for _, p in calls] == ["fp16", "fp16", "fp32", "fp32"]
    assert plan.conv_impls == {"conv1": "native", "primary_caps.conv": "channels_last"}


# --- the plan's cache key and backend settings ----------------------------------------------

def test_a_gpu_plan_is_keyed_by_capability_and_cudnn_not_cpu_threads():
    a100 = describe_machine("cuda", "NVIDIA A100", "2.11", capability=(8, 0), cuda="12.4",
                            cudnn=90100, backends={"matmul": "highest"})
    assert "threads" not in a100  # torchrun's OMP_NUM_THREADS=1 does not move a GPU plan
    assert a100["capability"] == [8, 0] and a100["cudnn"] == 90100
    other_cudnn = describe_machine("cuda", "NVIDIA A100", "2.11", capability=(8, 0),
                                   cuda="12.4", cudnn=90200, backends={"matmul": "highest"})
    assert other_cudnn != a100
    cpu = describe_machine("cpu", "AMD EPYC", "2.13", threads=2)
    assert cpu["threads"] == 2 and "capability" not in cpu


def test_tune_backends_for_a_gpu_sets_cudnn_and_matmul_flags(monkeypatch):
    """tune_backends' CUDA branch only sets process flags, which a CPU build holds too."""
    from capsnet.devices import tune_backends

    cudnn = torch.backends.cudnn
    before = (cudnn.benchmark, cudnn.deterministic, torch.get_float32_matmul_precision())
    try:
        torch.set_float32_matmul_precision("high")  # as the old code left it: TF32
        tune_backends(torch.device("cuda", 1))
        assert cudnn.benchmark and not cudnn.deterministic
        assert torch.get_float32_matmul_precision() == "highest"
        tune_backends(torch.device("cuda"), deterministic=True)
        assert cudnn.deterministic and not cudnn.benchmark
    finally:
        cudnn.benchmark, cudnn.deterministic = before[:2]
        torch.set_float32_matmul_precision(before[2])


def test_backend_flags_keep_matmuls_float32_and_offer_deterministic_cudnn():
    assert backend_flags("cuda") == {"matmul_precision": "highest", "cudnn_benchmark": True,
                                     "cudnn_deterministic": False}
    assert backend_flags("cuda", deterministic=True)["cudnn_benchmark"] is False
    assert backend_flags("cpu") == {"matmul_precision": "highest"}  # no TF32, no cuDNN


# --- timing on a GPU: CUDA events, warm-up, ten rounds ---------------------------------------

def test_the_gpu_schedule_warms_up_and_times_many_calls_per_sample():
    gpu = timing_schedule("cuda")
    assert gpu.warmup >= 3 and gpu.repeats >= 10 and gpu.min_repeats >= 10 and gpu.inner > 1
    assert gpu.rows is None and gpu.context_batch is None  # the real batch on a GPU
    assert gpu.drop_ratio is None and gpu.budget_s is None
    assert timing_schedule("cpu") is CPU_SCHEDULE and timing_schedule("mps") is CPU_SCHEDULE


class FakeClock:
    """A clock for interleaved_medians: each function's sample is its fixed cost; counts
    the calls and the inner iterations asked for."""

    def __init__(self, costs):
        self.costs, self.samples, self.inner = costs, [0] * len(costs), set()

    def __call__(self, fn, device, inner):
        i = fn()
        self.samples[i] += 1
        self.inner.add(inner)
        return self.costs[i]


def test_a_gpu_schedule_times_every_candidate_every_round():
    calls = [0, 0]
    fns = [lambda i=i: calls.__setitem__(i, calls[i] + 1) or i for i in range(2)]
    clock = FakeClock([1.0, 5.0])
    gpu = timing_schedule("cuda")
    assert interleaved_medians(fns, "cuda", gpu, clock=clock) == [1.0, 5.0]
    assert clock.samples == [gpu.repeats] * 2 and clock.inner == {gpu.inner}
    assert calls == [gpu.warmup + gpu.repeats] * 2  # warm-up calls, then one per sample


def test_a_cpu_schedule_drops_clearly_slower_candidates_and_stops_at_the_deadline():
    fns = [lambda i=i: i for i in range(3)]
    cpu = TimingSchedule(warmup=1, repeats=3, drop_ratio=1.25, warm_all=False)
    clock = FakeClock([1.0, 1.1, 2.0])
    assert interleaved_medians(fns, CPU, cpu, clock=clock) == [1.0, 1.1, 2.0]
    assert clock.samples == [3, 3, 1]  # the slow one ran one round
    clock = FakeClock([1.0, 1.1, 2.0])
    interleaved_medians(fns, CPU, cpu, deadline=0.0, clock=clock)
    assert clock.samples == [1, 1, 1]  # past the budget: one round only
    assert contenders([1.0, 1.2, 1.3], 1.25) == [0, 1] and contenders([3.0], None) == [0]
    assert contenders([2.0, 2.4], 1.25, bar=1.0) == []  # a rival precision did better
    assert contenders([1.02, 1.0, 1.04], 1.25, tie=1.05) == [1]  # a tie: the fastest, done


def test_a_cpu_warms_up_once_per_layer_a_gpu_every_candidate():
    """On a CPU only a layer's first call pays for growing the heap: one warm-up call, none
    when a rival precision timed the layer already; on a GPU every candidate autotunes."""
    cpu, gpu = CPU_SCHEDULE, timing_schedule("cuda")
    fns = [lambda: 0, lambda: 1, lambda: 2]
    assert warm_up_calls(fns, cpu, bar=float("inf")) == fns[:1]
    assert warm_up_calls(fns, cpu, bar=1.0) == []
    assert warm_up_calls(fns, gpu, bar=1.0) == fns
    calls = [0, 0]
    counted = [lambda i=i: calls.__setitem__(i, calls[i] + 1) or i for i in range(2)]
    interleaved_medians(counted, CPU, cpu, clock=lambda fn, device, inner: float(fn()) + 1.0)
    assert calls == [2, 1]  # a warm-up call and a timed one; one timed call (then dropped)


def test_a_second_precision_is_screened_on_a_quarter_of_the_images():
    """float32 after bf16 timed PrimaryCaps in 1.0 s: each float32 candidate runs once on a
    quarter of the batch beside bf16's fastest; the clearly slower ones are timed no more,
    their time scaled to the full batch; the close one is timed as usual."""
    from capsnet.tuning.conv_timer import ConvTimer

    timer = ConvTimer(CapsNet(TINY), CPU, 64, "train")
    timer.best["primary_caps.conv"] = (1.0, "bf16", "native")
    quarter = iter([0.1, 0.2, 0.3, 0.11])  # bf16's fastest, then gemm, native, channels_last
    timer._clock = lambda fn, device, inner: (fn(), next(quarter))[1]
    seconds = timer("primary_caps.conv", ("gemm", "native", "channels_last"), "fp32")
    assert seconds["gemm"] == pytest.approx(2.0) and seconds["native"] == pytest.approx(3.0)
    assert seconds["channels_last"] < 1.0  # timed for real: the tiny layer takes milliseconds
    assert timer.best["primary_caps.conv"][1:] == ("fp32", "channels_last")


def test_a_spent_budget_is_said_and_the_whole_step_check_still_runs(monkeypatch):
    """Past the budget rounds are cut short, but the cheaper layers are still checked in
    whole steps: alone, their short calls are the noisiest."""
    monkeypatch.setattr(plan_module, "low_precisions", lambda device: [])

    class OutOfTime:
        def __call__(self, name, impls, precision):  # conv1 the cheaper layer
            scale = 0.1 if name == "conv1" else 1.0
            return {impl: scale * (1.0 + 0.1 * k) for k, impl in enumerate(impls)}

        def in_context(self, name, impls, precision, choices):
            return {impl: 2.0 - 0.1 * k for k, impl in enumerate(impls)}

        def out_of_time(self):
            return True

    plan = choose_plan(CapsNet(TINY), CPU, 8, measure=OutOfTime(), use_cache=False)
    assert plan.budget_spent and plan.context_timings
    assert plan.conv_impls["conv1"] == "channels_last"  # the whole steps' choice
    assert "time budget reached" in plan.describe()


# --- devices ----------------------------------------------------------------------------------

def test_a_cuda_device_that_is_not_there_is_one_clear_line():
    with pytest.raises(ValueError, match="CUDA is not available.*--device cpu"):
        check_cuda_device(torch.device("cuda"), visible=0)
    with pytest.raises(ValueError, match="only 2 CUDA devices are visible"):
        check_cuda_device(torch.device("cuda", 2), visible=2)
    check_cuda_device(torch.device("cuda", 1), visible=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_train_on_cuda_without_cuda_is_one_line(tiny_mnist_dir, tmp_path, capsys):
    from capsnet.cli.main import main
    from tests.conftest import last_error_line

    assert main(["train", "--device", "cuda", "--preset", "small", "--data-dir",
                 str(tiny_mnist_dir), "--no-download", "--out-dir", str(tmp_path / "run")]) == 1
    assert "CUDA is not available" in last_error_line(capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("local_rank, visible, index", [(0, 2, 0), (1, 2, 1), (1, 8, 1),
                                                        (1, 1, 0), (3, 1, 0)])
def test_each_rank_takes_its_own_gpu(local_rank, visible, index):
    """torchrun: LOCAL_RANK=1 trains on cuda:1; under SLURM's one visible GPU per task
    every rank trains on cuda:0."""
    assert cuda_index_for(local_rank, visible) == index


def test_more_ranks_than_gpus_is_a_clear_error():
    with pytest.raises(ValueError, match="LOCAL_RANK=2 but this process sees 2 GPUs"):
        cuda_index_for(2, 2)


# --- DDP: every rank decides alike ----------------------------------------------------------

def test_a_non_finite_loss_on_another_rank_stops_this_one_too():
    """The read-back sums the loss over the ranks, so a NaN on rank 1 stops rank 0 at the
    same step (a rank that stopped alone would leave the others waiting in NCCL)."""
    from capsnet.training.loop import NonFiniteLossError, checked_mean_loss

    local = torch.tensor(2.0)  # this rank's finite loss sum over 4 images
    assert checked_mean_loss(local, 4, None, "here") == 0.5
    other_rank = torch.tensor([float("nan"), 4.0], dtype=torch.float64)
    with pytest.raises(NonFiniteLossError, match="nan within"):
        checked_mean_loss(local, 4, lambda t: t + other_rank, "within steps 1-20")
    assert checked_mean_loss(local, 4, lambda t: 2 * t, "here") == 0.5  # two equal ranks


def test_multimnist_validation_is_shared_out_and_summed(monkeypatch):
    """Each of two ranks evaluates every other pair; summed, the accuracy is one
    process's, the same number on both ranks."""
    from capsnet.experiments import multimnist_training as mm
    from capsnet.experiments.multimnist import pair_set
    from capsnet.training import distributed
    from capsnet.training.distributed import World

    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig(image_size=36, conv1_channels=8, primary_types=2,
                                  decoder_hidden=(16,)))
    images = torch.randint(0, 256, (30, 28, 28), dtype=torch.uint8)
    pairs = pair_set(images, torch.arange(30) % 10, 15, seed=1)
    whole = mm.evaluate_pairs(model, pairs, batch_size=4)["accuracy"]
    counts = {}

    def all_reduce_sum(tensor, world):  # what gloo/NCCL would sum: both ranks' counts
        counts[world.rank] = tensor.clone()
        return tensor

    monkeypatch.setattr(distributed, "all_reduce_sum", all_reduce_sum)
    for rank in (0, 1):
        mm.evaluate_pairs(model, pairs, batch_size=4, world=World(rank=rank, size=2))
    assert (counts[0] + counts[1]).item() / len(pairs) == pytest.approx(whole)


def test_evaluating_a_model_sets_the_backends_as_training_did(monkeypatch):
    """`evaluate` (and every command loading a model) applies tune_backends, so that on a
    GPU it runs the kernels the run did (no TF32 matmuls) and writes the same cache key."""
    import argparse

    import capsnet.cli.args as cli_args

    seen = []
    monkeypatch.setattr(cli_args, "tune_backends",
                        lambda device, deterministic=False: seen.append((device, deterministic)))
    args = argparse.Namespace(checkpoint=None, device="cpu", precision="fp32", conv_impl="gemm",
                              deterministic=True)
    cli_args.load_cli_model(args)
    assert seen == [(CPU, True)]
