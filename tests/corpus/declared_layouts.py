"""Kernels that take only some operand layouts, or only aligned operands, and refuse the rest with their own
exception, and their declared twins.

Undeclared, a check hands them what they refuse and fails; declared (``layouts``, ``alignment``), it draws none of
it and they pass. Each computes correctly wherever it does not refuse.
"""

from __future__ import annotations

import numpy as np

import gmm_kernels
import gmm_ref
from gmm_ref.layouts import blocks
from tests.corpus.broken_kernels import _mm32, grouped_mm_correct, ragged_dot_correct


def _ragged_dot_general(lhs, rhs, group_sizes, dimension_numbers, preferred_element_type):
    """A correct ragged_dot_general in float32 sums: the call read as its problem, each group's block multiplied."""
    p = gmm_ref.conventions.get("ragged_dot_general").parse(
        np.asarray(lhs), np.asarray(rhs), np.asarray(group_sizes), dimension_numbers,
        preferred_element_type=None if preferred_element_type is None else np.dtype(preferred_element_type))
    out = np.zeros(p.out_shape, np.float32)
    for blk in blocks(p):
        out[blk.out_index] = _mm32(blk.a, blk.b)
    return out.astype(p.out_dtype)


def _no_transposed_rhs(rhs, dimension_numbers):
    """Refuse an rhs stored transposed: its contracting dim is its last."""
    (_, rhs_contracting), _ = dimension_numbers.dot_dimension_numbers
    if tuple(rhs_contracting) == (np.ndim(rhs) - 1,):
        raise NotImplementedError("rhs must be stored [..., K, N], not transposed")


def ragged_dot_general_no_transposed_rhs(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, precision=None,
                                         preferred_element_type=None):
    """ragged_dot_general that refuses a transposed rhs (a valid layout of the convention)."""
    _no_transposed_rhs(rhs, ragged_dot_dimension_numbers)
    return _ragged_dot_general(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, preferred_element_type)


@gmm_kernels.declare("ragged_dot_general", layouts=("plain", "lhsT"))
def ragged_dot_general_layouts_declared(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, precision=None,
                                        preferred_element_type=None):
    """The honest twin: the same refusal, declared."""
    _no_transposed_rhs(rhs, ragged_dot_dimension_numbers)
    return _ragged_dot_general(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, preferred_element_type)


def _rows_of_16_bytes(lhs):
    """Refuse an lhs whose rows (K elements) do not span a multiple of 16 bytes (a kernel of 16-byte loads)."""
    if np.shape(lhs)[-1] * np.dtype(lhs.dtype).itemsize % 16:
        raise ValueError(f"lhs rows must span a multiple of 16 bytes, got K = {np.shape(lhs)[-1]} of {lhs.dtype}")


def ragged_dot_lhs_rows_of_16_bytes(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """ragged_dot that refuses an lhs of rows not a multiple of 16 bytes (K odd, say: a valid problem)."""
    _rows_of_16_bytes(lhs)
    return ragged_dot_correct(lhs, rhs, group_sizes, precision, preferred_element_type)


@gmm_kernels.declare("ragged_dot", alignment={"lhs": 16})
def ragged_dot_alignment_declared(lhs, rhs, group_sizes, precision=None, preferred_element_type=None):
    """The honest twin: the same refusal, declared."""
    _rows_of_16_bytes(lhs)
    return ragged_dot_correct(lhs, rhs, group_sizes, precision, preferred_element_type)


def _strides_of_32_bytes(*tensors):
    """Refuse an operand with a stride, other than its unit one, that is not a multiple of 32 bytes (of an axis of
    more than one element: the others move no address; an operand of no element has none to misalign)."""
    for name, t in zip(("mat_a", "mat_b"), tensors, strict=True):
        if t.numel() == 0:
            continue
        used = [i for i in range(t.dim()) if t.shape[i] > 1]
        unit = max((i for i in used if t.stride(i) == 1), default=None)
        if any(t.stride(i) * t.element_size() % 32 for i in used if i != unit):
            raise RuntimeError(f"{name}: strides must be multiples of 32 bytes, got {t.stride()} of {t.dtype}")


def grouped_mm_strides_of_32_bytes(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm that needs 32-byte strides, twice torch's own rule (a slice's rows, 16 bytes wider, and an
    odd row count of a transposed view break it)."""
    _strides_of_32_bytes(mat_a, mat_b)
    return grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)


@gmm_kernels.declare("torch.grouped_mm", alignment=32)
def grouped_mm_alignment_declared(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """The honest twin: the same refusal, declared."""
    _strides_of_32_bytes(mat_a, mat_b)
    return grouped_mm_correct(mat_a, mat_b, offs, bias, out_dtype)
