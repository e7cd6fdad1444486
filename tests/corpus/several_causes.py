"""Kernels with several independent bugs each, written to show that one run reports every cause.

Each carries refusals of problems its convention allows (a kernel that simply does not take them, which a
declaration scopes out) beside a real wrong-output bug, so that the first cause found hides the others unless the
harness goes on looking. Their honest twins declare the refusals and compute correctly.
"""

from __future__ import annotations

import numpy as np

import gmm_kernels
from tests.corpus.broken_kernels import grouped_mm_correct, ragged_dot_correct, ragged_dot_last_row_next_expert


def grouped_mm_three_causes(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm that refuses N = 0 and a transposed ``mat_b`` (both valid inputs), and whose K loop also
    reads the first row of the next expert's weights (times zero: invisible until that row holds a NaN or an Inf,
    the poisoned mode's values)."""

    if mat_b.shape[-1] == 0:
        raise ValueError("N must be positive")
    if mat_b.stride(-1) != 1:
        raise RuntimeError("mat_b must have a unit last stride")
    out = grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)
    if offs is None or mat_a.dim() != 2 or mat_b.dim() != 3:
        return out
    ends = [int(e) for e in offs.tolist()]
    b = mat_b.float()
    for g, (s, e) in enumerate(zip([0, *ends[:-1]], ends, strict=True)):
        if g + 1 < b.shape[0] and e > s:
            leak = (0 * b[g + 1, :1]).sum(0)  # one row of the next expert, times zero
            out[s:e] = (out[s:e].float() + leak).to(out.dtype)
    return out


@gmm_kernels.declare("torch.grouped_mm", zero_extents=("m", "k"), unit_stride=("rhs",))
def grouped_mm_refusals_declared(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """The honest twin: the same refusals, declared, and no leak."""
    if mat_b.shape[-1] == 0:
        raise ValueError("N must be positive")
    if mat_b.stride(-1) != 1:
        raise RuntimeError("mat_b must have a unit last stride")
    return grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)


def ragged_dot_two_causes(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """ragged_dot that asserts K > 0 (its own AssertionError on a valid input) and computes the last row of every
    group with the next group's weights."""
    assert np.asarray(lhs).shape[-1] > 0, "K must be positive"
    return ragged_dot_last_row_next_expert(lhs, rhs, group_sizes, precision, preferred_element_type)


@gmm_kernels.declare("ragged_dot", zero_extents=("m", "n"))
def ragged_dot_refusal_declared(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """The honest twin: the same assertion, declared, and every row right."""
    assert np.asarray(lhs).shape[-1] > 0, "K must be positive"
    return ragged_dot_correct(lhs, rhs, group_sizes, precision, preferred_element_type)


def moe_experts_two_causes(hidden_states, weight, topk_ids, topk_weights, expert_map=None):
    """torch.moe_experts that refuses top_k = 1 (its own exception) and drops every token's last slot."""
    import torch

    t, top_k = topk_ids.shape
    if top_k == 1:
        raise NotImplementedError("top_k = 1 is not supported")
    out = torch.zeros((t, weight.shape[1]), dtype=torch.float32)
    for i in range(t):
        for j in range(top_k - 1):
            e = int(topk_ids[i, j]) if expert_map is None else int(expert_map[int(topk_ids[i, j])])
            if e >= 0:
                out[i] += float(topk_weights[i, j]) * (weight[e].float() @ hidden_states[i].float())
    return out.to(hidden_states.dtype)
