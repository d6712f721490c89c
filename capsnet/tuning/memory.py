"""How much memory a training run needs: an estimate from the model's config and the batch.

A training step's peak is the model state (weights, gradients and Adam's two moments: 16
bytes a parameter) plus the larger of two moments: the forward pass at its peak (what
autograd keeps for the backward pass, the layers' working buffers, and for CapsNet two
copies of the prediction vectors u_hat while they are made contiguous), or Adam's update
(one temporary of every parameter and one of the largest). The terms follow the code
(capsnet.layers, capsnet.models): an activation kept for backward is counted in the compute
dtype (2 bytes in bf16/fp16, 4 in float32), routing and squash always in float32, the GEMM
convolution path's buffers and, in bf16, the im2col matrix it keeps.

Checked against the peak bytes of live tensors on a CPU (benchmarks/memory_check.py) within
25% for every preset; on a GPU the same check reads ``torch.cuda.max_memory_allocated``
(cuDNN's workspaces come on top there, and the CUDA context outside torch's allocator).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from capsnet.models import (
    CapsNetConfig,
    CNNConfig,
    EfficientCapsNetConfig,
    EMCapsNetConfig,
    build_model,
    count_parameters,
)

FLOAT32 = 4
GIB = 2**30
MIN_CHUNK_WIDTH = 256  # capsnet.layers.gemm_conv: a GEMM chunk is at least this wide
# Of a GPU's memory, the share torch's caching allocator can use (fragmentation), and what
# the CUDA context and libraries take outside it.
GPU_USABLE_SHARE = 0.9
GPU_CONTEXT_BYTES = 512 * 2**20


class MemoryExceeded(RuntimeError):
    """A run that ran out of device memory, said in one line with the estimate."""


@dataclass(frozen=True)
class ConvShape:
    """One convolution as the estimate sees it: channels, input side, kernel, stride,
    padding, and whether its input arrives channels-last (no copy for the GEMM path)."""

    c_in: int
    c_out: int
    size: int
    kernel: int
    stride: int = 1
    padding: int = 0
    input_channels_last: bool = False

    @property
    def grid(self) -> int:
        return (self.size + 2 * self.padding - self.kernel) // self.stride + 1

    @property
    def padded_input(self) -> int:
        return self.c_in * (self.size + 2 * self.padding) ** 2


@dataclass
class MemoryEstimate:
    """Bytes at the peak of a training step: the model state, what is already on the device
    (the dataset), and the larger of the forward pass (``per_image`` parts times the batch,
    plus ``casts``: the 16-bit weight copies autocast makes) and Adam's update."""

    batch_size: int
    model_state: int
    per_image: dict[str, int] = field(default_factory=dict)
    casts: int = 0
    optimizer_step: int = 0
    resident: int = 0

    @property
    def activations(self) -> int:
        return self.batch_size * sum(self.per_image.values())

    @property
    def total(self) -> int:
        return self.resident + self.model_state + max(self.activations + self.casts,
                                                      self.optimizer_step)

    def describe(self) -> str:
        """One line for the run log."""
        resident = f", already on the device {self.resident / GIB:.2f} GiB" if self.resident else ""
        return (f"about {self.total / GIB:.2f} GiB at batch {self.batch_size} per process "
                f"(weights, gradients and Adam {self.model_state / GIB:.2f} GiB, activations "
                f"{self.activations / GIB:.2f} GiB{resident}; estimate)")


def estimate_training_memory(config, batch_size: int, precision: str = "fp32",
                             conv_impls: dict[str, str] | None = None, device_type: str = "cpu",
                             resident: int = 0) -> MemoryEstimate:
    """Peak bytes of a training step of the model ``config`` describes at ``batch_size``
    images, in ``precision`` with ``conv_impls`` (layer name -> implementation, as in a
    :class:`~capsnet.tuning.SpeedPlan`; missing layers: 'gemm', the layers' default) on a
    ``device_type``; ``resident``: bytes already on the device (the dataset)."""
    with torch.device("meta"):
        model = build_model(config)
    params = count_parameters(model)
    largest = max(p.numel() for p in model.parameters())
    if device_type == "cuda":  # foreach Adam: a temporary of every parameter, then per tensor
        step = FLOAT32 * (params + largest)
    else:  # single-tensor Adam: two temporaries of the parameter being updated
        step = 2 * FLOAT32 * largest
    low = precision != "fp32"
    if isinstance(config, CapsNetConfig):
        per_image, cast_params = _capsnet_activations(config, low, conv_impls or {}, device_type)
    elif isinstance(config, CNNConfig):
        per_image, cast_params = _cnn_activations(config, low, conv_impls or {}, device_type)
    elif isinstance(config, EfficientCapsNetConfig):
        per_image, cast_params = _efficient_activations(config, low, conv_impls or {},
                                                        device_type)
    elif isinstance(config, EMCapsNetConfig):
        per_image, cast_params = _em_activations(config, low, conv_impls or {}, device_type)
    else:
        raise TypeError(f"no memory estimate for {type(config).__name__}")
    return MemoryEstimate(batch_size, 4 * FLOAT32 * params, per_image,
                          2 * cast_params if low else 0, step, resident)


def _conv_terms(shape: ConvShape, path: str, size: int, first: bool) -> tuple[int, int]:
    """Bytes per image a convolution adds: (kept for backward, largest working buffer).
    ``path``: 'gemm' (capsnet's per-kernel-row products, CPU) or 'library' (oneDNN/cuDNN:
    its backward's input and output gradients; cuDNN's workspaces come on top on a GPU);
    ``size``: bytes of the compute dtype."""
    k, c, grid = shape.kernel, shape.c_in, shape.grid
    if path != "gemm":
        return 0, size * (c * shape.size**2 + shape.c_out * grid**2)
    rows = min(k, max(1, math.ceil(MIN_CHUNK_WIDTH / (k * c))))
    chunk = grid**2 * rows * k * c  # elements of one im2col chunk
    gradient = FLOAT32 * shape.padded_input  # the input gradient, summed in float32
    if size == FLOAT32:  # a padded or channels-last copy of the input; one chunk buffer
        copied = shape.padding or not (c == 1 or shape.input_channels_last)
        kept = FLOAT32 * shape.padded_input if copied else 0
        return kept, gradient + FLOAT32 * chunk
    # 16-bit: the whole im2col matrix is kept for the weight gradient, and a 16-bit copy of
    # the input when it is padded or arrives in float32 (the first layer)
    copied = shape.padding or first
    kept = size * (shape.padded_input if copied else 0) + size * grid**2 * k * k * c
    return kept, gradient + (size + FLOAT32) * chunk


def _paths(names: list[str], conv_impls: dict[str, str], device_type: str) -> list[str]:
    """Each convolution's path: the GEMM products only where they run (CPU)."""
    return ["gemm" if device_type == "cpu" and conv_impls.get(n, "gemm") == "gemm"
            else "library" for n in names]


def _capsnet_activations(cfg: CapsNetConfig, low: bool, conv_impls: dict[str, str],
                         device_type: str) -> tuple[dict[str, int], int]:
    """Per-image bytes at CapsNet's forward peak (the prediction vectors u_hat made and
    made contiguous), and the parameters autocast copies (the convolutions')."""
    size = 2 if low else FLOAT32
    paths = _paths(["conv1", "primary_caps.conv"], conv_impls, device_type)
    conv1 = ConvShape(cfg.in_channels, cfg.conv1_channels, cfg.image_size, cfg.conv1_kernel,
                      cfg.conv1_stride)
    primary = ConvShape(cfg.conv1_channels, cfg.primary_types * cfg.primary_dim,
                        conv1.grid, cfg.primary_kernel, cfg.primary_stride,
                        input_channels_last=conv_impls.get("conv1", "gemm") != "native")
    kept1, work1 = _conv_terms(conv1, paths[0], size, first=True)
    kept2, work2 = _conv_terms(primary, paths[1], size, first=False)
    caps = cfg.num_primary_caps
    capsules = 4 * FLOAT32 * caps * cfg.primary_dim  # float32 copy, squash's temporaries
    u_hat = 2 * FLOAT32 * cfg.num_classes * caps * cfg.digit_dim  # einsum, then contiguous
    parts = {"input": 2 * FLOAT32 * cfg.in_channels * cfg.image_size**2,
             "conv1": size * conv1.c_out * conv1.grid**2 + kept1,
             "primary capsules": size * primary.c_out * primary.grid**2 + kept2,
             "peak": max(work1, work2, capsules + u_hat)}
    cast = conv1.c_in * conv1.c_out * conv1.kernel**2 + primary.c_in * primary.c_out \
        * primary.kernel**2
    return parts, cast


def _cnn_activations(cfg: CNNConfig, low: bool, conv_impls: dict[str, str],
                     device_type: str) -> tuple[dict[str, int], int]:
    """Per-image bytes of the CNN baseline's peak (its last convolution's backward, the
    others' activations kept), and the parameters autocast copies (all its weights)."""
    size = 2 if low else FLOAT32
    names = [f"features.{2 * i}" for i in range(len(cfg.conv_channels))]
    paths = _paths(names, conv_impls, device_type)
    channels = (cfg.in_channels, *cfg.conv_channels)
    parts = {"input": 2 * FLOAT32 * cfg.in_channels * cfg.image_size**2}
    work, cast = 0, 0
    for i, (c_in, c_out) in enumerate(zip(channels[:-1], channels[1:], strict=True)):
        previous = conv_impls.get(names[i - 1], "gemm") if i else "native"
        shape = ConvShape(c_in, c_out, cfg.image_size, cfg.conv_kernel,
                          padding=cfg.conv_kernel // 2, input_channels_last=previous != "native")
        kept, buffer = _conv_terms(shape, paths[i], size, first=i == 0)
        parts[names[i]] = size * c_out * shape.grid**2 + kept
        work, cast = max(work, buffer), cast + c_in * c_out * cfg.conv_kernel**2
    parts["peak"] = work
    sizes = (cfg.conv_channels[-1] * cfg.image_size**2, *cfg.fc_hidden, cfg.num_classes)
    cast += sum(a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    return parts, cast


def _efficient_activations(cfg: EfficientCapsNetConfig, low: bool, conv_impls: dict[str, str],
                           device_type: str) -> tuple[dict[str, int], int]:
    """Per-image bytes of Efficient-CapsNet's peak: each block keeps its ReLU output (for
    the ReLU's and BatchNorm's backward) and its BatchNorm output (the next layer's input),
    both in the compute dtype; the peak is the largest convolution's working buffer; its
    capsules are a few hundred numbers. The parameters autocast copies: the convolutions'
    and the decoder's. Checked like the others (tests/test_efficient_capsnet.py)."""
    size = 2 if low else FLOAT32
    names = [f"features.{i}.conv" for i in range(len(cfg.conv_channels))]
    paths = _paths(names, conv_impls, device_type)
    channels = (cfg.in_channels, *cfg.conv_channels)
    parts = {"input": 2 * FLOAT32 * cfg.in_channels * cfg.image_size**2}
    side, work, cast = cfg.image_size, 0, 0
    for i, (c_in, c_out) in enumerate(zip(channels[:-1], channels[1:], strict=True)):
        previous = conv_impls.get(names[i - 1], "gemm") if i else "native"
        shape = ConvShape(c_in, c_out, side, cfg.conv_kernels[i], cfg.conv_strides[i],
                          input_channels_last=previous != "native")
        kept, buffer = _conv_terms(shape, paths[i], size, first=i == 0)
        parts[names[i]] = 2 * size * c_out * shape.grid**2 + kept
        side, work = shape.grid, max(work, buffer)
        cast += c_in * c_out * cfg.conv_kernels[i] ** 2
    parts["peak"] = work
    if cfg.use_decoder:
        sizes = (cfg.num_classes * cfg.digit_dim, *cfg.decoder_hidden, cfg.num_pixels)
        parts["decoder"] = 2 * FLOAT32 * sum(sizes)
        cast += sum(a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True))
    return parts, cast


# EM routing keeps, for its backward pass, the votes and each iteration's squared deviations
# of the votes from the means (1 + 3 vote-sized float32 tensors per capsule layer), and the
# backward's temporaries come on top: 5.4-5.7 vote-sized tensors per vote element measured
# (benchmarks/memory_check.py, presets paper and small, CPU float32).
EM_VOTE_COPIES = 6


def _em_activations(cfg: EMCapsNetConfig, low: bool, conv_impls: dict[str, str],
                    device_type: str) -> tuple[dict[str, int], int]:
    """Per-image bytes of the EM capsule network's peak (its capsule layers' votes, kept in
    float32 through the routing iterations, dominate), and the parameters autocast copies
    (the two convolutions')."""
    from capsnet.layers.matrix_caps import POSE_SIZE

    size = 2 if low else FLOAT32
    paths = _paths(["conv1", "primary_caps.conv"], conv_impls, device_type)
    conv1 = ConvShape(cfg.in_channels, cfg.conv1_channels, cfg.image_size, cfg.conv1_kernel,
                      cfg.conv1_stride)
    primary = ConvShape(cfg.conv1_channels, cfg.primary_types * (POSE_SIZE + 1), conv1.grid, 1,
                        input_channels_last=conv_impls.get("conv1", "gemm") != "native")
    kept1, work1 = _conv_terms(conv1, paths[0], size, first=True)
    kept2, work2 = _conv_terms(primary, paths[1], size, first=False)
    window = cfg.caps_kernel**2
    votes = POSE_SIZE * (  # vote elements of ConvCaps1, ConvCaps2 and the class capsules
        cfg.caps1_grid**2 * cfg.caps1_types * window * cfg.primary_types
        + cfg.caps2_grid**2 * cfg.caps2_types * window * cfg.caps1_types
        + cfg.num_classes * cfg.caps2_grid**2 * cfg.caps2_types)
    parts = {"input": 2 * FLOAT32 * cfg.in_channels * cfg.image_size**2,
             "conv1": size * conv1.c_out * conv1.grid**2 + kept1,
             "primary capsules": (size + FLOAT32) * primary.c_out * primary.grid**2 + kept2,
             "routing": EM_VOTE_COPIES * FLOAT32 * votes,
             "peak": max(work1, work2)}
    cast = conv1.c_in * conv1.c_out * conv1.kernel**2 + primary.c_in * primary.c_out
    return parts, cast


def largest_batch(config, capacity: int, precision: str = "fp32",
                  conv_impls: dict[str, str] | None = None, device_type: str = "cuda",
                  resident: int = 0) -> int:
    """The largest batch whose estimate fits in ``capacity`` bytes (0 if none does)."""
    def fits(batch: int) -> bool:
        return estimate_training_memory(config, batch, precision, conv_impls, device_type,
                                        resident).total <= capacity

    low, high = 0, 1
    while fits(high) and high < 2**20:
        low, high = high, 2 * high
    while high - low > 1:  # fits(low), not fits(high)
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def device_memory(device: torch.device) -> int | None:
    """A GPU's memory in bytes; None for other devices."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory


def usable_gpu_bytes(total: int) -> int:
    """Of a GPU's ``total`` bytes, what a run's tensors can count on."""
    return max(0, int(GPU_USABLE_SHARE * total) - GPU_CONTEXT_BYTES)


def out_of_memory_message(device: str, estimate: MemoryEstimate, total: int | None,
                          fits: int) -> str:
    """The one line a run that ran out of device memory ends with."""
    capacity = f" of the GPU's {total / GIB:.1f} GiB" if total else ""
    advice = (f"the largest batch estimated to fit is about {fits} (--batch-size {fits})"
              if fits else "not even one image fits: use a smaller preset, --precision bf16 "
              "(or fp16), or a larger GPU")
    return (f"{device} ran out of memory at batch {estimate.batch_size} per process: the "
            f"estimate is {estimate.total / GIB:.2f} GiB{capacity}; {advice}. The checkpoints "
            f"of the epochs before are intact")
