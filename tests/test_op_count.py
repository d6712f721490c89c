"""The paper model's training step counted in ATen operators: forward, margin and
reconstruction loss, backward, with PyTorch's native convolution. Each operator that is not
a view is one kernel launch on a GPU (one dispatch on a CPU). Held to a budget, so that a
change that adds kernels shows."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from capsnet.layers import GemmConv2d
from capsnet.losses import capsule_loss
from capsnet.models.capsnet import CapsNet, CapsNetConfig
from capsnet.squashing import squash

# Measured by this counter: 406 operators, 265 of them kernels, with autograd's squash (25
# forward and 42 backward operators a call; benchmarks/squash_speed.py keeps it); 306 and
# 179 with the fused one; 241 and 157 with the routing's last iteration, the predictions
# W u and the margin and reconstruction losses as Functions with their analytic gradients;
# 200 and 135 with squash as t m (10 forward operators, 14 with the gradient's parts, 6
# backward), the decoder as a Function (its layers 52 -> 36 operators, no transposes or
# views in its backward) and the lengths |v| from the routing's Function (their gradient
# one addcmul into v's).
STEP_OP_BUDGET = 203
STEP_KERNEL_BUDGET = 138
SQUASH_OP_BUDGET = 21  # one fused call: 14 forward, 6 backward, the leaf's detach
SQUASH_INFERENCE_OP_BUDGET = 10  # without autograd: v = t m and nothing else
ALIASES = ("aten.detach.default", "aten._unsafe_view.default")  # views in all but name


class OpCounter(TorchDispatchMode):
    """The ATen operators dispatched while it is active, views included."""

    def __init__(self):
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))

    def kernels(self) -> list:
        """The operators that compute (not views of their inputs)."""
        return [op for op in self.ops if not op.is_view and str(op) not in ALIASES]


def paper_model_native() -> CapsNet:
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig())
    for conv in model.modules():
        if isinstance(conv, GemmConv2d):
            conv.set_impl("native")
    return model


def test_paper_step_stays_within_its_operator_budget():
    model = paper_model_native()
    images, labels = torch.rand(2, 1, 28, 28), torch.tensor([3, 7])  # (B, 1, 28, 28), (B,)
    with OpCounter() as counter:
        capsule_loss(model(images, labels), images, labels).backward()
    assert len(counter.ops) <= STEP_OP_BUDGET, f"{len(counter.ops)} operators"
    assert len(counter.kernels()) <= STEP_KERNEL_BUDGET, f"{len(counter.kernels())} kernels"


def test_squash_forward_and_backward_within_budget():
    s = torch.randn(4, 10, 16, requires_grad=True)  # (B, J, D)
    g = torch.randn(4, 10, 16)
    with OpCounter() as counter:
        squash(s).backward(g)
    assert len(counter.ops) <= SQUASH_OP_BUDGET, [str(op) for op in counter.ops]


def test_squash_without_autograd_computes_only_its_output():
    s = torch.randn(4, 10, 16)  # (B, J, D)
    with OpCounter() as counter:
        squash(s)
    assert len(counter.ops) <= SQUASH_INFERENCE_OP_BUDGET, [str(op) for op in counter.ops]
