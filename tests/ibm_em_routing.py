"""Test-only reference: the EM routing of IBM/matrix-capsules-with-em-routing (Ashley
Gritzman, Apache 2.0; the companion code of "Avoiding implementation pitfalls of matrix
capsules with EM routing"), transcribed from TensorFlow to numpy, float64, step by step.

Transcribed from commit 00b79063 (em_routing.py: ``em_routing``, ``m_step``, ``e_step``)
and 076e71f5 (utils.py: ``create_routing_map``, ``group_children_by_parent``, ``init_rr``,
``to_sparse``, ``softmax_across_parents``, ``to_dense``), with FLAGS.epsilon = 1e-9 and
FLAGS.final_lambda = 0.01 from config.py. Layouts are IBM's: votes (N*OH*OW, kh*kw*i, o,
16), activations (N*OH*OW, kh*kw*i, 1), betas (1, 1, 1, 1, o, 1). Kept as written: the
variance's +1e-9, the mean's division by (sum + epsilon), log(a_j + epsilon), the sparse
filler min(min(zz), -100) and the cost's ``layer_norm_factor`` = 100 / (kh*kw*i / o).
Only dropout (drop_rate 0) and TensorBoard summaries are left out.
"""
from __future__ import annotations

import numpy as np

EPSILON = 1e-9  # FLAGS.epsilon


def create_routing_map(child_space: int, k: int, s: int) -> np.ndarray:
    """utils.create_routing_map: (child_space^2, parent_space^2), 1 where a child (row)
    feeds a parent (column)."""
    parent_space = int((child_space - k) / s + 1)
    binmap = np.zeros((child_space**2, parent_space**2))
    for r in range(parent_space):
        for c in range(parent_space):
            p_idx = r * parent_space + c
            for i in range(k):
                c_idx = r * s * child_space + c * s + child_space * i
                binmap[c_idx:c_idx + k, p_idx] = 1
    return binmap


def group_children_by_parent(bin_routing_map: np.ndarray) -> np.ndarray:
    """utils.group_children_by_parent: (parent_space^2, kk) child indices per parent."""
    tmp = np.where(np.transpose(bin_routing_map))
    return np.reshape(tmp[1], [bin_routing_map.shape[1], -1])


def init_rr(spatial_routing_matrix: np.ndarray, child_caps: int, parent_caps: int) -> np.ndarray:
    """utils.init_rr: 1 / (parents of the child, over space and depth), (1, ps, ps, kk,
    child_caps, parent_caps)."""
    parent_space = int(np.sqrt(spatial_routing_matrix.shape[1]))
    parents_per_child = np.sum(spatial_routing_matrix, axis=1, keepdims=True)
    rr_initial = spatial_routing_matrix / (parents_per_child * parent_caps + 1e-9)
    mask = spatial_routing_matrix.astype(bool)
    rr_initial = rr_initial.T[mask.T]
    rr_initial = np.reshape(rr_initial, [parent_space, parent_space, -1])
    rr_initial = rr_initial[..., np.newaxis, np.newaxis]
    rr_initial = np.tile(rr_initial, [1, 1, 1, child_caps, parent_caps])
    return np.expand_dims(rr_initial, 0)


def to_sparse(probs: np.ndarray, spatial_routing_matrix: np.ndarray,
              sparse_filler: float) -> np.ndarray:
    """utils.to_sparse: (N, ps, ps, kk, cc, pc) -> (N, ps, ps, child_space^2, cc, pc), the
    slots scattered to their global child positions, the rest (and exact zeros) filled."""
    batch_size, parent_space, _, kk, child_caps, parent_caps = probs.shape
    child_space_2, parent_space_2 = spatial_routing_matrix.shape
    probs_unroll = np.reshape(probs, [batch_size, parent_space_2, kk, child_caps, parent_caps])
    child_to_parent_idx = group_children_by_parent(spatial_routing_matrix)
    sparse = np.zeros([batch_size, parent_space_2, child_space_2, child_caps, parent_caps])
    for p in range(parent_space_2):  # tf.scatter_nd with [batch, parent, child] indices
        for q in range(kk):
            sparse[:, p, child_to_parent_idx[p, q]] = probs_unroll[:, p, q]
    sparse = np.where(sparse == 0.0, sparse_filler, sparse)
    return np.reshape(sparse, [batch_size, parent_space, parent_space, child_space_2,
                               child_caps, parent_caps])


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    """tf.nn.softmax (max-subtracted)."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_across_parents(probs_sparse: np.ndarray,
                           spatial_routing_matrix: np.ndarray) -> np.ndarray:
    """utils.softmax_across_parents: softmax over parent space and depth at once."""
    batch_size, parent_space, _, child_space_2, child_caps, parent_caps = probs_sparse.shape
    sparse = np.transpose(probs_sparse, [0, 3, 4, 1, 2, 5])
    sparse = np.reshape(sparse, [batch_size, child_space_2, child_caps, -1])
    parent_softmax = _softmax(sparse, axis=-1)
    parent_softmax = np.reshape(parent_softmax, [batch_size, child_space_2, child_caps,
                                                 parent_space, parent_space, parent_caps])
    return np.transpose(parent_softmax, [0, 3, 4, 1, 2, 5])


def to_dense(sparse: np.ndarray, spatial_routing_matrix: np.ndarray) -> np.ndarray:
    """utils.to_dense: back to (N, ps, ps, kk, cc, pc) by the routing map's mask."""
    batch_size, parent_space, _, child_space_2, child_caps, parent_caps = sparse.shape
    kk = int(np.sum(spatial_routing_matrix[:, 0]))
    sparse_unroll = np.reshape(sparse, [batch_size, parent_space * parent_space,
                                        child_space_2, child_caps, parent_caps])
    dense = sparse_unroll[:, np.transpose(spatial_routing_matrix).astype(bool)]  # boolean_mask
    return np.reshape(dense, [batch_size, parent_space, parent_space, kk, child_caps,
                              parent_caps])


def m_step(rr, votes, activations_i, beta_v, beta_a, inverse_temperature):
    """em_routing.m_step (returns activations_j, mean_j, var_j; stdv_j is None there)."""
    rr_prime = rr * activations_i
    rr_prime_sum = np.sum(rr_prime, axis=-3, keepdims=True)
    child_caps = float(rr_prime.shape[-3])
    parent_caps = float(rr_prime.shape[-2])
    ratio_child_to_parent = child_caps / parent_caps
    layer_norm_factor = 100 / ratio_child_to_parent
    mean_j_numerator = np.sum(rr_prime * votes, axis=-3, keepdims=True)
    mean_j = mean_j_numerator / (rr_prime_sum + EPSILON)
    var_j_numerator = np.sum(rr_prime * np.square(votes - mean_j), axis=-3, keepdims=True)
    var_j = var_j_numerator / (rr_prime_sum + EPSILON)
    var_j = var_j + 1e-9
    cost_j_h = (beta_v + 0.5 * np.log(var_j)) * rr_prime_sum * layer_norm_factor
    cost_j = np.sum(cost_j_h, axis=-1, keepdims=True)
    activations_j_cost = beta_a - cost_j
    activations_j = 1.0 / (1.0 + np.exp(-inverse_temperature * activations_j_cost))
    return activations_j, mean_j, var_j


def e_step(votes_ij, activations_j, mean_j, var_j, spatial_routing_matrix):
    """em_routing.e_step."""
    o_p_unit0 = -np.sum(np.square(votes_ij - mean_j) / (2 * var_j), axis=-1, keepdims=True)
    o_p_unit2 = -0.5 * np.sum(np.log(2 * np.pi * var_j), axis=-1, keepdims=True)
    o_p = o_p_unit0 + o_p_unit2
    zz = np.log(activations_j + EPSILON) + o_p
    batch_size, parent_space, _, kh_kw_i, parent_caps, _ = zz.shape
    kk = int(np.sum(spatial_routing_matrix[:, 0]))
    child_caps = int(kh_kw_i / kk)
    zz = np.reshape(zz, [batch_size, parent_space, parent_space, kk, child_caps, parent_caps])
    sparse_filler = np.minimum(np.min(zz), -100)
    zz_sparse = to_sparse(zz, spatial_routing_matrix, sparse_filler=sparse_filler)
    rr_sparse = softmax_across_parents(zz_sparse, spatial_routing_matrix)
    rr_dense = to_dense(rr_sparse, spatial_routing_matrix)
    return np.reshape(rr_dense, [batch_size, parent_space, parent_space, kh_kw_i,
                                 parent_caps, 1])


def em_routing(votes_ij, activations_i, batch_size, spatial_routing_matrix, beta_v, beta_a,
               iter_routing: int = 3, final_lambda: float = 0.01):
    """em_routing.em_routing: poses (N, OH, OW, o, 16), activations (N, OH, OW, o, 1)."""
    N = batch_size
    OH = OW = int(np.sqrt(votes_ij.shape[0] / N))
    kh_kw_i, o, n_channels = votes_ij.shape[1:]
    kk = int(np.sum(spatial_routing_matrix[:, 0]))
    parent_caps = o
    child_caps = int(kh_kw_i / kk)
    parent_space = int(np.sqrt(spatial_routing_matrix.shape[1]))
    votes_ij = np.reshape(votes_ij, [N, OH, OW, kh_kw_i, o, n_channels])
    activations_i = np.reshape(activations_i, [N, OH, OW, kh_kw_i, 1, 1])
    rr = init_rr(spatial_routing_matrix, child_caps, parent_caps)
    rr = np.reshape(rr, [1, parent_space, parent_space, kk * child_caps, parent_caps, 1])
    for it in range(iter_routing):
        inverse_temperature = final_lambda * (1 - np.power(0.95, it + 1))
        activations_j, mean_j, var_j = m_step(rr, votes_ij, activations_i, beta_v, beta_a,
                                              inverse_temperature)
        if it < iter_routing - 1:
            rr = e_step(votes_ij, activations_j, mean_j, var_j, spatial_routing_matrix)
    poses_j = np.squeeze(mean_j, axis=-3)
    activations_j = np.squeeze(activations_j, axis=-3)
    return poses_j, activations_j
