"""The training step (capsnet.training.loop.train_step): nothing inside it reads back to the
host (so a CUDA graph can hold it, and an eager step never waits), the moving average on the
device follows the host rule, and the loop stays shallow (issue 46's frame budget)."""
from __future__ import annotations

import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.loop_depth import TINY_RUN, measure
from capsnet.models import build_model, make_config
from capsnet.training.loop import (
    classification_batch,
    classification_loss,
    train_step,
)
from capsnet.training.optimisation import WeightEMA

# Operators that wait for the device: a value read back (item, bool, tolist, equal, nonzero)
# or an output whose shape depends on the data.
SYNCING = {"_local_scalar_dense", "is_nonzero", "equal", "nonzero", "masked_select",
           "unique", "_unique2", "repeat_interleave", "bincount"}
FRAME_BUDGET, FILE_BUDGET = 6, 6  # issue 46: the first optimiser step at most ~6 frames deep
# the capsnet types met on the way (docs/architecture.md lists them; issue 46 aims at ~8)
TYPE_BUDGET = 10


class NoHostReads(TorchDispatchMode):
    """Raises on any operator that synchronises with the device (on a CPU too)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in SYNCING:
            raise AssertionError(f"the training step reads back to the host: {func}")
        return func(*args, **(kwargs or {}))


def one_hot_as_on_cuda(labels: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    """F.one_hot as it runs on CUDA with ``num_classes`` given: no check of the values (on a
    CPU it reads their minimum and maximum back; on CUDA scatter's device assert stands in)."""
    assert num_classes > 0
    return (labels.unsqueeze(-1) == torch.arange(num_classes, device=labels.device)).long()


def test_the_guard_catches_a_read_back():
    with pytest.raises(AssertionError, match="reads back"), NoHostReads():
        torch.ones(2).sum().item()


@pytest.mark.parametrize("model, preset", [("capsnet", "small"), ("cnn", "small"),
                                           ("efficient", "small")])
def test_nothing_inside_the_step_reads_back_to_the_host(model, preset, monkeypatch):
    monkeypatch.setattr(torch.nn.functional, "one_hot", one_hot_as_on_cuda)
    torch.manual_seed(0)
    net = build_model(make_config(model, preset)).train()
    # fused, as the graphed step's (capturable=True is for GPUs; the unfused CPU Adam reads
    # its step count, a CPU tensor there, with .item())
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3, fused=True)
    ema = WeightEMA(net, 0.999)
    cfg = net.config
    batch = (torch.rand(4, cfg.in_channels, cfg.image_size, cfg.image_size),
             torch.randint(0, cfg.num_classes, (4,)))
    step = functools.partial(train_step, net, optimizer, classification_loss, ema=ema)
    before = [p.detach().clone() for p in net.parameters()]
    with NoHostReads():
        for _ in range(2):  # the second step has Adam's state: its own code path
            loss, right = step(batch, torch.tensor(0.5))
    assert torch.isfinite(loss) and 0 <= right <= 4 and ema.updates == 2
    assert all(not torch.equal(a, p) for a, p in zip(before, net.parameters(), strict=True))


@pytest.mark.parametrize("augmentation", [dict(max_shift=2), dict(crop=24),
                                          dict(max_shift=0, augment="efficient")])
def test_making_a_training_batch_reads_nothing_back(augmentation):
    images = torch.randint(0, 256, (16, 28, 28), dtype=torch.uint8)
    labels = torch.arange(16) % 10
    make_batch = classification_batch(None, images, labels, torch.Generator().manual_seed(0),
                                      **augmentation)
    with NoHostReads():
        x, y = make_batch(torch.arange(8))
    assert x.shape[0] == 8 and torch.equal(y, labels[:8])


def test_the_average_on_the_device_follows_the_host_rule():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    ema = WeightEMA(model, 0.99, warmup=True)
    expected = model.weight.detach().clone()
    for n in range(5):
        with torch.no_grad():
            model.weight.add_(torch.randn(2, 3))
        ema.update(model)
        expected.lerp_(model.weight.detach(), 1.0 - ema.decay_at(n))
    assert torch.equal(ema.module.weight, expected) and ema.updates == 5


def test_the_first_optimiser_step_is_within_the_frame_and_type_budgets(tiny_mnist_dir, tmp_path):
    depth = measure([*TINY_RUN, "--data-dir", str(tiny_mnist_dir), "--no-download",
                     "--out-dir", str(tmp_path)])
    assert len(depth.frames) <= FRAME_BUDGET, depth.frames
    assert len(depth.files) <= FILE_BUDGET, depth.files
    assert len(depth.types) <= TYPE_BUDGET, depth.types
    assert depth.frames[0] == "cli/main.py:main"
    assert depth.frames[-1] == "training/loop.py:train_step"
