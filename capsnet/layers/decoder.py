"""The reconstruction decoder: masked DigitCaps output -> FC ReLU layers -> sigmoid pixels."""
from __future__ import annotations

import torch
from torch import nn


def perceptron(x: torch.Tensor, params: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """x (B, N) through the layers (weight, bias, weight, bias, ...): ReLU after each but the
    last, sigmoid after the last; the input and every layer's output."""
    layers = len(params) // 2
    outputs = [x]
    for i in range(layers):
        z = torch.addmm(params[2 * i + 1], outputs[-1], params[2 * i].t())  # (B, n_out)
        outputs.append(z.sigmoid_() if i == layers - 1 else z.relu_())
    return outputs


class Perceptron(torch.autograd.Function):
    """:func:`perceptron`'s pixels with the gradients of the input and of each weight and
    bias by two products and a sum a layer (autograd's graph of nn.Linear adds transposes,
    views and detaches). Its backward is differentiable: with ``create_graph`` the layers'
    outputs are recomputed under autograd."""

    @staticmethod
    def forward(x: torch.Tensor, *params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(perceptron(x, params)[:0:-1])  # pixels, then the hidden layers' outputs

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(*inputs, *output)

    @staticmethod
    def backward(ctx, g: torch.Tensor | None, *_) -> tuple[torch.Tensor | None, ...]:
        if g is None:
            return (None,) * len(ctx.needs_input_grad)
        x, *saved = ctx.saved_tensors
        layers = len(saved) // 3  # 2 parameters and 1 output each
        params, outputs = tuple(saved[:2 * layers]), [x, *saved[:2 * layers - 1:-1]]
        if torch.is_grad_enabled():  # a graph of the gradient: the outputs with their graph
            outputs = perceptron(x, params)
        grads: list[torch.Tensor | None] = []
        g = torch.ops.aten.sigmoid_backward(g, outputs[-1])  # (B, n_out)
        for i in reversed(range(layers)):
            grads[:0] = [g.t().mm(outputs[i]), g.sum(dim=0)]  # (n_out, n_in), (n_out,)
            if i > 0:
                g = torch.ops.aten.threshold_backward(g.mm(params[2 * i]), outputs[i], 0)
        g_x = g.mm(params[0]) if ctx.needs_input_grad[0] else None  # (B, N)
        return g_x, *grads


class Decoder(nn.Module):
    """Poses (B, J, D) and the capsule to keep (B,) or a mask (B, J) -> images (B, C, H, W)
    in [0, 1]; the other capsules are zeroed, as in the paper's Figure 2. Under autograd the
    layers run as :class:`Perceptron` (the analytic gradients); under autocast they run in
    its dtype, as nn.Linear would."""

    def __init__(self, num_caps: int, caps_dim: int, hidden: tuple[int, ...],
                 image_shape: tuple[int, int, int]):
        super().__init__()
        self.image_shape = image_shape
        sizes = (num_caps * caps_dim, *hidden)
        layers: list[nn.Module] = []
        for n_in, n_out in zip(sizes[:-1], sizes[1:], strict=False):
            layers += [nn.Linear(n_in, n_out), nn.ReLU(inplace=True)]
        n_pixels = image_shape[0] * image_shape[1] * image_shape[2]
        layers += [nn.Linear(sizes[-1], n_pixels), nn.Sigmoid()]
        self.net = nn.Sequential(*layers)

    def forward(self, poses: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        B, J, _ = poses.shape
        if keep.dim() == 1:  # class indices -> a (B, J) mask, with no host sync
            keep = torch.arange(J, device=keep.device) == keep.unsqueeze(-1)
        x = (poses * keep.unsqueeze(-1)).view(B, -1)  # (B, J*D), the mask 0/1 in poses' dtype
        params = tuple(p for layer in self.net if isinstance(layer, nn.Linear)
                       for p in (layer.weight, layer.bias))
        device = x.device.type
        if torch.is_autocast_enabled(device) and x.dtype != torch.float64:  # as autocast
            dtype = torch.get_autocast_dtype(device)
            x, params = x.to(dtype), tuple(p.to(dtype) for p in params)
        with torch.autocast(device_type=device, enabled=False):
            if torch.is_grad_enabled() and not torch.jit.is_tracing():
                pixels = Perceptron.apply(x, *params)[0]  # (B, C*H*W)
            else:
                pixels = perceptron(x, params)[-1]  # (B, C*H*W)
        return pixels.view(B, *self.image_shape)  # (B, C, H, W)
