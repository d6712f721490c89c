"""The decisions of capsnet's CUDA branches, run on a CPU: each depends on plain values (a
device type, a compute capability, a LOCAL_RANK, a saved RNG state), so a test gives it the
values a GPU machine would. No GPU is needed; what still needs one is listed in the notes
of issue 25 (docs)."""
from __future__ import annotations

import pytest
import torch

from capsnet.devices import backend_flags, check_cuda_device, describe_machine
from capsnet.models import CapsNet, CapsNetConfig
from capsnet.training.distributed import cuda_index_for

CPU = torch.device("cpu")


# --- the machine a plan is kept for, and backend settings ------------------------------------

def test_a_gpu_machine_is_described_by_capability_and_cudnn_not_cpu_threads():
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
    from capsnet.experiments import multimnist as mm
    from capsnet.training import distributed
    from capsnet.training.distributed import World

    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig(image_size=36, conv1_channels=8, primary_types=2,
                                  decoder_hidden=(16,)))
    images = torch.randint(0, 256, (30, 28, 28), dtype=torch.uint8)
    pairs = mm.pair_set(images, torch.arange(30) % 10, 15, seed=1)
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
