"""The generic routed capsule layer, convolutional capsules and position-shared class
capsules against slow loop references (votes by plain loops, routed by the same router),
their gradients, every router through each, and a 3-layer stack that learns."""
from __future__ import annotations

import pytest
import torch

from capsnet.layers import CapsuleLayer, ConvCapsules, DigitCaps, SharedClassCapsules, squash
from capsnet.layers.conv_caps import scaled_coordinates
from capsnet.layers.routed_caps import balanced_init_std
from capsnet.losses import margin_loss
from capsnet.routing import ROUTERS, make_router

ROUTER_NAMES = sorted(ROUTERS)


def router(name: str, children: int, parents: int, dim: int, **options):
    return make_router(name, children=children, parents=parents, pose_dim=dim, iterations=3,
                       **options).double()


def capsules(*shape: int) -> torch.Tensor:
    return squash(torch.randn(*shape, dtype=torch.float64)).requires_grad_()


def loop_votes(W: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """u_hat[n, j, i] = W[i, j] @ u[n, i], by loops: (N, J, I, D)."""
    N, I = u.shape[:2]
    J = W.shape[1]
    return torch.stack([torch.stack([torch.stack([W[i, j] @ u[n, i] for i in range(I)])
                                     for j in range(J)]) for n in range(N)])


def assert_same_with_gradients(fast, slow, inputs) -> None:
    """Equal outputs and equal gradients of a random projection w.r.t. ``inputs``."""
    for f, s in zip(fast, slow, strict=True):
        torch.testing.assert_close(f, s)
    weights = [torch.randn_like(f) for f in fast]
    def projection(outputs):
        return sum((w * o).sum() for w, o in zip(weights, outputs, strict=True))

    grads_fast = torch.autograd.grad(projection(fast), inputs)
    grads_slow = torch.autograd.grad(projection(slow), inputs)
    for f, s in zip(grads_fast, grads_slow, strict=True):
        torch.testing.assert_close(f, s)


@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_capsule_layer_equals_loops_for_every_router(name):
    torch.manual_seed(0)
    I, d, J, D = 5, 3, 4, 6
    layer = CapsuleLayer(I, d, J, D, router(name, I, J, D), init_std=0.5).double()
    u = capsules(2, 3, I, d)  # leading dims (2, 3): six independent routings
    routed = layer(u)
    flat = u.reshape(6, I, d)
    activations = torch.linalg.vector_norm(flat, dim=-1) if name == "em" else None
    slow = layer.router(loop_votes(layer.W, flat), activations)
    assert routed.poses.shape == (2, 3, J, D) and routed.activations.shape == (2, 3, J)
    assert_same_with_gradients(
        (routed.poses.reshape(6, J, D), routed.activations.reshape(6, J)),
        (slow.poses, slow.activations), (u, layer.W))


def test_capsule_layer_stacks_and_names_its_shapes():
    first = CapsuleLayer(6, 4, 5, 8, router("dynamic", 6, 5, 8))
    second = CapsuleLayer(5, 8, 3, 16, router("em", 5, 3, 16))
    out = first(squash(torch.randn(7, 6, 4)))
    routed = second(out.poses, out.activations)
    assert routed.poses.shape == (7, 3, 16) and routed.activations.shape == (7, 3)
    with pytest.raises(ValueError, match=r"expects input capsules \(\.\.\., 5, 8\), got"):
        second(torch.randn(7, 4, 8))


def test_digit_caps_is_a_capsule_layer_with_the_papers_shapes():
    layer = DigitCaps(1152, 8, 10, 16, router("dynamic", 1152, 10, 16))
    assert isinstance(layer, CapsuleLayer)
    assert list(layer.state_dict()) == ["W"] and layer.W.shape == (1152, 10, 16, 8)


def loop_conv_votes(layer: ConvCapsules, poses: torch.Tensor):
    """Each output cell's window by loops over rows, columns, kernel slots and types, zero
    capsules where the window leaves the padded grid: votes (B*P, T_out, K, D)."""
    B, H, W, T, d = poses.shape
    k, s, p = layer.kernel, layer.stride, layer.padding
    rows, columns = layer.out_grid(H, W)
    cells = []
    for b in range(B):
        for y in range(rows):
            for x in range(columns):
                slots = []
                for ky in range(k):
                    for kx in range(k):
                        r, c = y * s + ky - p, x * s + kx - p
                        inside = 0 <= r < H and 0 <= c < W
                        for t in range(T):
                            u = poses[b, r, c, t] if inside else poses.new_zeros(d)
                            slots.append(torch.stack([layer.W[ky * k + kx, t, j] @ u
                                                      for j in range(layer.out_types)]))
                cells.append(torch.stack(slots, dim=1))  # (T_out, K, D)
    return torch.stack(cells)


@pytest.mark.parametrize("name", ROUTER_NAMES)
@pytest.mark.parametrize("stride, padding", [(1, 1), (2, 0)])
def test_conv_capsules_equal_loops_for_every_router(name, stride, padding):
    torch.manual_seed(1)
    T_in, d, T_out, D, k = 2, 3, 3, 4, 3
    K = k * k * T_in
    layer = ConvCapsules(T_in, d, T_out, D, router(name, K, T_out, D), kernel=k, stride=stride,
                         padding=padding, init_std=0.5).double()
    poses = capsules(2, 5, 5, T_in, d)
    out_poses, out_activations = layer(poses)
    rows, columns = layer.out_grid(5, 5)
    assert out_poses.shape == (2, rows, columns, T_out, D)
    slow_votes = loop_conv_votes(layer, poses)
    torch.testing.assert_close(layer.votes(poses), slow_votes)
    activations = None
    if name == "em":
        lengths = torch.linalg.vector_norm(poses, dim=-1)  # (B, H, W, T)
        activations = layer.windows(lengths.unsqueeze(-1)).reshape(slow_votes.shape[0], K)
    slow = layer.router(slow_votes, activations)
    assert_same_with_gradients(
        (out_poses.reshape(-1, T_out, D), out_activations.reshape(-1, T_out)),
        (slow.poses, slow.activations), (poses, layer.W))


@pytest.mark.parametrize("name", ROUTER_NAMES)
def test_shared_class_capsules_equal_loops_with_coordinate_addition(name):
    torch.manual_seed(2)
    H, W, T, d, J, D = 3, 4, 2, 3, 5, 4
    layer = SharedClassCapsules(T, d, J, D, router(name, H * W * T, J, D),
                                init_std=0.5).double()
    poses = capsules(2, H, W, T, d)
    u_hat, routed = layer.route(poses)
    rows, columns = scaled_coordinates(H).double(), scaled_coordinates(W).double()
    slow_votes = torch.zeros(2, J, H * W * T, D, dtype=torch.float64)
    for b in range(2):
        for j in range(J):
            for y in range(H):
                for x in range(W):
                    for t in range(T):
                        vote = layer.W[t, j] @ poses[b, y, x, t]
                        coordinates = torch.stack([rows[y], columns[x]])
                        vote = vote + layer.coordinate_scale * torch.cat(
                            [coordinates, vote.new_zeros(D - 2)])
                        slow_votes[b, j, (y * W + x) * T + t] = vote
    torch.testing.assert_close(u_hat, slow_votes)
    activations = torch.linalg.vector_norm(poses, dim=-1).reshape(2, -1) if name == "em" else None
    slow = layer.router(slow_votes, activations)
    assert_same_with_gradients((routed.poses, routed.activations),
                               (slow.poses, slow.activations), (poses, layer.W))


def test_shared_class_capsules_parameters_do_not_grow_with_the_grid():
    layer = SharedClassCapsules(8, 8, 1000, 16, router("dynamic", 1, 1000, 16))
    assert sum(p.numel() for p in layer.parameters()) == 8 * 1000 * 16 * 8 + 1
    assert layer(squash(torch.randn(1, 7, 7, 8, 8))).poses.shape == (1, 1000, 16)


@pytest.mark.parametrize("name, options", [("em", {}), ("dynamic", {"routing_full_graph": True})])
def test_conv_capsules_gradcheck(name, options):
    torch.manual_seed(3)
    layer = ConvCapsules(1, 2, 2, 2, router(name, 4, 2, 2, **options), kernel=2,
                         init_std=0.5).double()
    poses = capsules(1, 3, 3, 1, 2)
    assert torch.autograd.gradcheck(lambda p: layer(p)[0], (poses,))


def test_three_routed_layers_learn():
    """Two classes of noisy input capsules; three stacked routed layers reach 95% in seconds."""
    torch.manual_seed(4)
    I, d = 8, 4
    prototypes = squash(torch.randn(2, I, d))  # (2, I, d)
    labels = torch.randint(0, 2, (256,))
    u = squash(prototypes[labels] + 0.3 * torch.randn(256, I, d))
    sizes = [(I, d), (6, 8), (6, 8), (2, 8)]
    layers = torch.nn.ModuleList(
        CapsuleLayer(i, di, j, dj, router("dynamic", i, j, dj).float(),
                     init_std=balanced_init_std(i, j, dj))
        for (i, di), (j, dj) in zip(sizes, sizes[1:], strict=False))
    optimizer = torch.optim.Adam(layers.parameters(), lr=0.02)
    for _ in range(60):
        poses, activations = u, None
        for layer in layers:
            routed = layer(poses, activations)
            poses, activations = routed.poses, routed.activations
        loss = margin_loss(activations, labels).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert (activations.argmax(-1) == labels).float().mean() > 0.95


@pytest.mark.parametrize("options", [{}, {"routing_full_graph": True},
                                     {"none_of_the_above": True}])
@pytest.mark.parametrize("coordinate_addition", [True, False])
def test_shared_class_capsules_route_dynamically_without_the_votes(options, coordinate_addition):
    """forward's factored dynamic routing (W after the sum) equals the router on the votes."""
    torch.manual_seed(5)
    H, W, T, d, J, D = 3, 2, 2, 3, 4, 5
    layer = SharedClassCapsules(T, d, J, D, router("dynamic", H * W * T, J, D, **options),
                                coordinate_addition, init_std=0.5).double()
    poses = capsules(2, H, W, T, d)
    fast = layer(poses)
    slow = layer.route(poses)[1]
    for f, s in zip(fast.couplings[1:], slow.couplings[1:], strict=True):
        torch.testing.assert_close(f, s)
    assert fast.couplings[0].shape == slow.couplings[0].shape
    inputs = (poses, layer.W, *([layer.coordinate_scale] if coordinate_addition else []))
    assert_same_with_gradients((fast.poses, fast.activations), (slow.poses, slow.activations),
                               inputs)
