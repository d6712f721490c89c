"""A valid convolution computed as matrix products over channels-last patches (CPU path).

PrimaryCaps' convolution (256 -> 256 channels, 9x9, stride 2, a 6x6 output grid) holds
almost all of CapsNet's arithmetic. oneDNN's direct convolution runs it at 30-45% of this
CPU's matmul rate, its backward pass being the slow part. Unrolled one kernel row at a time,
the same convolution is three large matrix products per row (forward, weight gradient,
input gradient) that run at close to the matmul rate:

    patches  (B*Gh*Gw, Kw*C)   row ``r`` of every receptive field, copied from (B, H, W, C)
    out     += patches @ W_r   W_r: (Kw*C, O), the weights of kernel row ``r``
    dW_r     = patches^T @ dout
    dx[rows r + stride*i] += (dout @ W_r^T) scattered back column by column

The copy is one kernel row of the im2col matrix (Kw*C wide instead of Kh*Kw*C), so the
extra memory is 1/Kh of a full im2col. The results equal ``F.conv2d`` to float rounding
(tests/test_gemm_conv.py checks outputs and all gradients in float64).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.autograd.function import once_differentiable


def _kernel_row_patches(x_cl: torch.Tensor, row: int, kernel: tuple[int, int],
                        stride: tuple[int, int], grid: tuple[int, int]) -> torch.Tensor:
    """View (B, Gh, Gw, Kw, C) of ``x_cl`` (B, H, W, C): kernel row ``row`` of each
    receptive field. No copy; each (Kw, C) block is contiguous in memory."""
    B, _, _, C = x_cl.shape
    sb, sh, sw, sc = x_cl.stride()
    return x_cl.as_strided((B, grid[0], grid[1], kernel[1], C),
                           (sb, stride[0] * sh, stride[1] * sw, sw, sc),
                           x_cl.storage_offset() + row * sh)


class _RowGemmConv2d(torch.autograd.Function):
    """conv2d(x, weight, bias, stride) with no padding, dilation 1 and one group."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride):
        B, C, H, W = x.shape
        O, _, Kh, Kw = weight.shape
        grid = ((H - Kh) // stride[0] + 1, (W - Kw) // stride[1] + 1)
        rows = B * grid[0] * grid[1]
        x_cl = x.permute(0, 2, 3, 1).contiguous()  # (B, H, W, C)
        w_rows = weight.permute(2, 3, 1, 0).reshape(Kh, Kw * C, O)  # (Kh, Kw*C, O)
        if bias is None:
            out = x.new_zeros(rows, O)  # (B*Gh*Gw, O)
        else:
            out = bias.expand(rows, O).contiguous()  # (B*Gh*Gw, O)
        for row in range(Kh):
            patches = _kernel_row_patches(x_cl, row, (Kh, Kw), stride, grid)
            out.addmm_(patches.reshape(rows, Kw * C), w_rows[row])  # (B*Gh*Gw, O)
        ctx.save_for_backward(x_cl, weight)
        ctx.stride, ctx.grid, ctx.has_bias = stride, grid, bias is not None
        return out.view(B, grid[0], grid[1], O).permute(0, 3, 1, 2)  # (B, O, Gh, Gw)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        x_cl, weight = ctx.saved_tensors
        stride, grid = ctx.stride, ctx.grid
        B, H, W, C = x_cl.shape
        O, _, Kh, Kw = weight.shape
        rows = B * grid[0] * grid[1]
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad = grad_out.permute(0, 2, 3, 1).reshape(rows, O)  # (B*Gh*Gw, O)
        grad_x_cl = torch.zeros_like(x_cl) if need_x else None  # (B, H, W, C)
        grad_w_rows = x_cl.new_empty(Kh, Kw * C, O) if need_w else None  # (Kh, Kw*C, O)
        w_rows_t = weight.permute(2, 0, 3, 1).reshape(Kh, O, Kw * C)  # (Kh, O, Kw*C)
        last_row, last_col = stride[0] * (grid[0] - 1) + 1, stride[1] * (grid[1] - 1) + 1
        for row in range(Kh):
            if need_w:
                patches = _kernel_row_patches(x_cl, row, (Kh, Kw), stride, grid)
                torch.mm(patches.reshape(rows, Kw * C).t(), grad, out=grad_w_rows[row])
            if need_x:
                grad_patches = (grad @ w_rows_t[row]).view(B, grid[0], grid[1], Kw, C)
                target = grad_x_cl[:, row:row + last_row:stride[0]]  # (B, Gh, W, C)
                for col in range(Kw):  # one column's positions never overlap: plain adds
                    target[:, :, col:col + last_col:stride[1]] += grad_patches[:, :, :, col]
        grad_x = grad_x_cl.permute(0, 3, 1, 2) if need_x else None  # (B, C, H, W)
        grad_w = grad_w_rows.view(Kh, Kw, C, O).permute(3, 2, 0, 1) if need_w else None
        grad_b = grad.sum(0) if (need_b and ctx.has_bias) else None
        return grad_x, grad_w, grad_b, None


class GemmConv2d(nn.Conv2d):
    """``nn.Conv2d`` without padding whose CPU float path runs as per-kernel-row matrix
    products (see the module docstring). Same parameters and ``state_dict`` as
    ``nn.Conv2d``; on GPUs, under autocast, torch.compile or tracing (ONNX and
    TorchScript export) it is plain ``nn.Conv2d``.

    Input (B, C_in, H, W). Output (B, C_out, H', W') with channels-last strides on the
    CPU path (a permuted view; ``.view`` of the channel dimension still works)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride)

    def _row_gemm_applies(self, x: torch.Tensor) -> bool:
        return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
                and x.dim() == 4 and x.shape[-2] >= self.kernel_size[0]
                and x.shape[-1] >= self.kernel_size[1] and not torch.is_autocast_enabled("cpu")
                and not torch.compiler.is_compiling() and not torch.jit.is_tracing())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._row_gemm_applies(x):
            return _RowGemmConv2d.apply(x, self.weight, self.bias, self.stride)
        return super().forward(x)
