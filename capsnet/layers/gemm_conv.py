"""A valid convolution computed as matrix products over channels-last patches (CPU path).

PrimaryCaps' convolution holds almost all of CapsNet's arithmetic, and oneDNN's direct
convolution (its backward above all) runs well below the CPU's matmul rate. Unrolled one
kernel row at a time, the same convolution is three large matrix products per row:

    patches  (B*Gh*Gw, Kw*C)   row ``r`` of every receptive field, copied from (B, H, W, C)
    out     += patches @ W_r   W_r: (Kw*C, O), the weights of kernel row ``r``
    dW_r     = patches^T @ dout
    dx[rows r + stride*i] += (dout @ W_r^T) scattered back column by column

so the extra memory is 1/Kh of a full im2col; narrow rows (Conv1's one channel) are grouped
into wider chunks. Under CPU bf16 autocast the products run in bf16 and their sums in fp32.
A backward pass that is itself differentiated (double backward, ``torch.func.grad``) runs
PyTorch's convolution backward instead. Results equal ``F.conv2d`` to float rounding."""
from __future__ import annotations

import torch
from torch import nn

from capsnet.config import conv_output_size

# A chunk of kernel rows is at least this many columns wide: one row of PrimaryCaps' kernel
# (9 x 256 = 2304) is a chunk of its own, Conv1's 1-channel rows (9 wide) are all unrolled.
MIN_CHUNK_WIDTH = 256

CONV_IMPLS = ("gemm", "native", "channels_last")
# Float types the products run in; anything narrower than float32 accumulates in float32.
GEMM_DTYPES = (torch.float32, torch.float64, torch.bfloat16)


def _row_chunks(kernel_rows: int, row_width: int) -> list[tuple[int, int]]:
    """[first, end) kernel-row ranges, each at least MIN_CHUNK_WIDTH columns wide (or all)."""
    per_chunk = max(1, -(-MIN_CHUNK_WIDTH // row_width))
    return [(r, min(r + per_chunk, kernel_rows)) for r in range(0, kernel_rows, per_chunk)]


def _chunk_of(buffer: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    """A contiguous (rows, columns) matrix at the start of ``buffer``'s memory. Reusing one
    buffer for every chunk spares a fresh allocation (and its page faults) per chunk."""
    return buffer.view(-1)[:rows * columns].view(rows, columns)


def _patches(x_cl: torch.Tensor, rows: tuple[int, int], kernel: tuple[int, int],
             stride: tuple[int, int], grid: tuple[int, int], buffer: torch.Tensor) -> torch.Tensor:
    """Kernel rows [first, end) of every receptive field of ``x_cl`` (B, H, W, C), copied
    into ``buffer`` as a (B*Gh*Gw, rows*Kw*C) matrix: one chunk of the im2col matrix."""
    B, _, _, C = x_cl.shape
    sb, sh, sw, sc = x_cl.stride()
    first, end = rows
    view = x_cl.as_strided((B, grid[0], grid[1], end - first, kernel[1], C),
                           (sb, stride[0] * sh, stride[1] * sw, sh, sw, sc),
                           x_cl.storage_offset() + first * sh)  # (B, Gh, Gw, rows, Kw, C)
    patches = _chunk_of(buffer, B * grid[0] * grid[1], (end - first) * kernel[1] * C)
    patches.view(view.shape).copy_(view)
    return patches  # (B*Gh*Gw, rows*Kw*C)


def _accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for bf16 operands (sums of many bf16 terms lose digits), else the dtype itself."""
    return torch.float32 if dtype == torch.bfloat16 else dtype


def _in_layout_of(grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``grad`` (channels-last) with exactly ``param``'s strides, as DDP's gradient buckets
    expect: the same memory when ``param`` is channels-last (strides of size-1 dimensions,
    e.g. Conv1's one input channel, may differ), else a contiguous copy."""
    if grad.stride() == param.stride():
        return grad
    if param.is_contiguous(memory_format=torch.channels_last):
        return grad.as_strided(param.shape, param.stride())
    return grad.contiguous()


class _RowGemmConv2d(torch.autograd.Function):
    """conv2d(x, weight, bias, stride) with no padding, dilation 1 and one group -> (output,
    kept): ``kept`` the bf16 im2col matrix kept for the weight gradient (``keep_columns``)
    or an empty tensor."""

    @staticmethod
    def forward(x, weight, bias, stride, keep_columns):
        B, C, H, W = x.shape
        O, _, Kh, Kw = weight.shape
        grid = (conv_output_size(H, Kh, stride[0]), conv_output_size(W, Kw, stride[1]))
        positions = B * grid[0] * grid[1]
        x_cl = x.permute(0, 2, 3, 1).contiguous()  # (B, H, W, C); free if x is channels-last
        w_rows = weight.permute(0, 2, 3, 1).reshape(O, Kh * Kw * C)  # free if channels-last
        # The result is allocated channels-last, so that it is no view (ReLU may work in
        # place on it) and its (B*Gh*Gw, O) matrix is the same memory.
        result = torch.empty((B, O, *grid), dtype=x.dtype, device=x.device,
                             memory_format=torch.channels_last)  # (B, O, Gh, Gw)
        out = result.permute(0, 2, 3, 1).view(positions, O)  # (B*Gh*Gw, O)
        if keep_columns:
            # Training in bf16: the whole im2col matrix (half the bytes of float32) in one
            # product, accumulated in float32 inside the GEMM, and kept for the weight gradient.
            cols = _patches(x_cl, (0, Kh), (Kh, Kw), stride, grid,
                            x.new_empty(positions, Kh * Kw * C))  # (B*Gh*Gw, Kh*Kw*C)
            torch.mm(cols, w_rows.t(), out=out)  # (B*Gh*Gw, O)
            if bias is not None:
                out += bias
            return result, cols  # (B, O, Gh, Gw), channels-last; (B*Gh*Gw, Kh*Kw*C)
        accumulate = _accumulator_dtype(x.dtype)
        if accumulate != x.dtype:  # bf16 products, summed over the kernel rows in float32
            out = x.new_empty(positions, O, dtype=accumulate)
        if bias is None:
            out.zero_()
        else:
            out.copy_(bias.expand(positions, O))
        chunks = _row_chunks(Kh, Kw * C)
        buffer = x.new_empty(positions, (chunks[0][1] - chunks[0][0]) * Kw * C)
        for first, end in chunks:
            patches = _patches(x_cl, (first, end), (Kh, Kw), stride, grid, buffer)
            w_chunk = w_rows[:, first * Kw * C:end * Kw * C].t()  # (n*Kw*C, O)
            if accumulate == x.dtype:
                out.addmm_(patches, w_chunk)  # (B*Gh*Gw, O)
            else:
                out += patches @ w_chunk
        if accumulate != x.dtype:
            result.permute(0, 2, 3, 1).view(positions, O).copy_(out)
        return result, x.new_empty(0)  # (B, O, Gh, Gw), channels-last; nothing kept

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, stride, _ = inputs
        result, kept = output
        ctx.mark_non_differentiable(kept)
        ctx.set_materialize_grads(False)  # no zeros of the kept matrix's size in backward
        ctx.save_for_backward(x, weight, kept)
        ctx.stride, ctx.grid, ctx.has_bias = stride, tuple(result.shape[-2:]), bias is not None

    @staticmethod
    def backward(ctx, grad_out, _grad_kept):
        x, weight, kept = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        if grad_out is None:
            return None, None, None, None, None
        if torch.is_grad_enabled():  # a graph of this backward is wanted
            return (*_differentiable_grads(grad_out, x, weight, ctx.stride,
                                           (need_x, need_w, need_b and ctx.has_bias)),
                    None, None)
        return (*_row_gemm_grads(grad_out, x, weight, kept, ctx.stride, ctx.grid,
                                 (need_x, need_w, need_b and ctx.has_bias)), None, None)


def _differentiable_grads(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                          stride: tuple[int, int], needed: tuple[bool, bool, bool]):
    """(grad_x, grad_w, grad_b) by PyTorch's convolution backward, itself differentiable."""
    grad_out = grad_out.to(x.dtype)  # (B, O, Gh, Gw)
    need_x, need_w, need_b = needed
    grad_x = (torch.nn.grad.conv2d_input(x.shape, weight, grad_out, stride)
              if need_x else None)  # (B, C, H, W)
    grad_w = (torch.nn.grad.conv2d_weight(x, weight.shape, grad_out, stride)
              if need_w else None)  # (O, C, Kh, Kw)
    grad_b = grad_out.sum((0, 2, 3)) if need_b else None  # (O,)
    return grad_x, grad_w, grad_b


def _row_gemm_grads(grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                    kept: torch.Tensor, stride: tuple[int, int], grid: tuple[int, int],
                    needed: tuple[bool, bool, bool]):
    """(grad_x, grad_w, grad_b) by the per-kernel-row products of the module docstring;
    ``kept``: the bf16 im2col matrix of the forward pass, or empty."""
    x_cl = x.permute(0, 2, 3, 1).contiguous()  # (B, H, W, C); free if x is channels-last
    B, H, W, C = x_cl.shape
    O, _, Kh, Kw = weight.shape
    positions = B * grid[0] * grid[1]
    need_x, need_w, need_b = needed
    grad = grad_out.to(x_cl.dtype).permute(0, 2, 3, 1).reshape(positions, O)  # (B*Gh*Gw, O)
    accumulate = _accumulator_dtype(x_cl.dtype)
    grad_x_cl = torch.zeros_like(x_cl, dtype=accumulate) if need_x else None  # (B, H, W, C)
    grad_w_rows = x_cl.new_empty(O, Kh * Kw * C) if need_w else None  # (O, Kh*Kw*C)
    w_rows = weight.permute(0, 2, 3, 1).reshape(O, Kh * Kw * C)  # (O, Kh*Kw*C)
    last_row, last_col = stride[0] * (grid[0] - 1) + 1, stride[1] * (grid[1] - 1) + 1
    chunks = _row_chunks(Kh, Kw * C)
    buffer = x_cl.new_empty(positions, (chunks[0][1] - chunks[0][0]) * Kw * C)
    # bf16 input gradients are summed in float32: each chunk is converted once, so that
    # the strided adds below run on one dtype (mixed-dtype adds are twice as slow)
    widened = buffer if accumulate == x_cl.dtype else torch.empty_like(buffer, dtype=accumulate)
    for first, end in chunks:
        cols = slice(first * Kw * C, end * Kw * C)
        if need_w:
            patches = (kept[:, cols] if kept.numel() else
                       _patches(x_cl, (first, end), (Kh, Kw), stride, grid, buffer))
            grad_w_rows[:, cols] = grad.t() @ patches  # (O, n*Kw*C)
        if not need_x:
            continue
        grad_patches = _chunk_of(buffer, positions, (end - first) * Kw * C)
        torch.mm(grad, w_rows[:, cols], out=grad_patches)  # (B*Gh*Gw, n*Kw*C)
        if widened is not buffer:
            wide = _chunk_of(widened, positions, grad_patches.shape[1])
            grad_patches = wide.copy_(grad_patches)
        grad_patches = grad_patches.view(B, grid[0], grid[1], end - first, Kw, C)
        for row in range(first, end):
            target = grad_x_cl[:, row:row + last_row:stride[0]]  # (B, Gh, W, C)
            for col in range(Kw):  # one (row, col)'s positions never overlap: plain adds
                target[:, :, col:col + last_col:stride[1]] += (
                    grad_patches[:, :, :, row - first, col])
    grad_x = grad_x_cl.to(x_cl.dtype).permute(0, 3, 1, 2) if need_x else None  # (B, C, H, W)
    grad_w = None
    if need_w:
        grad_w = _in_layout_of(grad_w_rows.view(O, Kh, Kw, C).permute(0, 3, 1, 2), weight)
    grad_b = None
    if need_b:
        grad_b = grad.sum(0, dtype=accumulate).to(x_cl.dtype)  # (O,)
    return grad_x, grad_w, grad_b


class GemmConv2d(nn.Conv2d):
    """``nn.Conv2d`` (same parameters and ``state_dict``) whose implementation is chosen per
    layer, ``impl`` in CONV_IMPLS: "gemm" the per-kernel-row products of this module (CPU,
    float32/float64 or bf16 autocast; elsewhere, under torch.compile and when traced it runs
    PyTorch's convolution), "native" PyTorch's on NCHW tensors, "channels_last" PyTorch's on
    channels-last ones. (B, C_in, H, W) -> (B, C_out, H', W'), channels-last strides on the
    "gemm" and "channels_last" paths."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0, impl: str | None = None):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=padding)
        self.impl = ""
        self.set_impl(impl or "gemm")

    def set_impl(self, impl: str) -> None:
        """Run as ``impl`` from now on. The weight takes the layout that path reads without
        copies: channels-last rows (O, Kh*Kw*C) for "gemm" and "channels_last", NCHW for
        "native" (oneDNN would otherwise switch to its channels-last path)."""
        if impl not in self.candidates():
            raise ValueError(f"conv implementation {impl!r} is not available for {self}; "
                             f"choose from {self.candidates()}")
        layout = torch.contiguous_format if impl == "native" else torch.channels_last
        with torch.no_grad():
            self.weight.data = self.weight.data.contiguous(memory_format=layout)
        self.impl = impl

    def candidates(self, device: torch.device | str = "cpu") -> tuple[str, ...]:
        """The implementations that can run this layer on ``device``."""
        return CONV_IMPLS if torch.device(device).type == "cpu" else CONV_IMPLS[1:]

    def _row_gemm_applies(self, x: torch.Tensor) -> bool:
        low_precision = torch.is_autocast_enabled("cpu")
        dtype_ok = (torch.get_autocast_dtype("cpu") == torch.bfloat16 if low_precision
                    else x.dtype in GEMM_DTYPES)
        return (self.impl == "gemm" and x.device.type == "cpu" and dtype_ok and x.dim() == 4
                and x.shape[-2] + 2 * self.padding[0] >= self.kernel_size[0]
                and x.shape[-1] + 2 * self.padding[1] >= self.kernel_size[1]
                and not torch.compiler.is_compiling() and not torch.jit.is_tracing()
                and not torch.jit.is_scripting())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._row_gemm_applies(x):
            weight, bias = self.weight, self.bias
            if self.padding != (0, 0):
                ph, pw = self.padding
                x = torch.nn.functional.pad(x, (pw, pw, ph, ph))  # (B, C, H + 2ph, W + 2pw)
            if torch.is_autocast_enabled("cpu"):  # what autocast would do: bf16 operands
                x, weight = x.to(torch.bfloat16), weight.to(torch.bfloat16)
                bias = None if bias is None else bias.to(torch.bfloat16)
            # bf16 training keeps the whole im2col matrix for the weight gradient
            keep_columns = (x.dtype == torch.bfloat16 and torch.is_grad_enabled()
                            and weight.requires_grad)
            with torch.autocast("cpu", enabled=False):
                return _RowGemmConv2d.apply(x, weight, bias, self.stride, keep_columns)[0]
        if self.impl == "channels_last":
            x = x.contiguous(memory_format=torch.channels_last)
        return super().forward(x)
