"""A problem's high-precision operands quantized with a kernel's declared format: the scaled problem that a
kernel which quantizes inside really computes (docs/scaled.md).

:func:`quantize_problem` quantizes each operand group by group in its ``[rows, K]`` view (M for lhs, N for
rhs, by K), so blocks restart at every group boundary as the model says. It takes the layouts whose K is
one axis of each stored operand: every family, untransposed, unpacked, without batch dims.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gmm_ref.problem import Problem
from gmm_ref.scaled.model import MXQuantizer
from gmm_ref.scaled.quantizers import AmaxQuantizer

__all__ = ["quantize_problem"]


def _check(name: str, q: Any) -> None:
    if q is not None and not isinstance(q, (MXQuantizer, AmaxQuantizer)):
        raise TypeError(f"{name}: expected a gmm_ref.MXQuantizer, a gmm_ref.AmaxQuantizer or None, got "
                        f"{type(q).__name__}")


def quantize_problem(p: Problem, lhs: Any = None, rhs: Any = None) -> Problem:
    """``p`` with ``lhs`` and/or ``rhs`` quantized by the given quantizers: codes in place of values, and their
    scales. Elements no group reads (a tail, other shards' rows) are quantized too, their scales dropped."""
    if not isinstance(p, Problem):
        raise TypeError(f"problem: expected a gmm_ref.Problem, got {type(p).__name__}")
    _check("lhs", lhs)
    _check("rhs", rhs)
    if p.scaled:
        raise ValueError("problem: already scaled (its operands are codes)")
    if p.lhs_transposed or p.rhs_transposed or p.packed or p.batch_ndim:
        raise ValueError("problem: quantize_problem takes untransposed, unpacked layouts without batch dims")
    if p.existing_out is not None:
        raise ValueError("problem: a scaled problem takes no existing_out")
    fields: dict[str, Any] = {}
    if lhs is not None:
        codes, scales = _quantize(p, "lhs", lhs)
        fields.update(lhs=codes, lhs_quant=lhs.quantization, lhs_scales=scales)
    if rhs is not None:
        codes, scales = _quantize(p, "rhs", rhs)
        fields.update(rhs=codes, rhs_quant=rhs.quantization, rhs_scales=scales)
    return p.replace(**fields) if fields else p


def _views(p: Problem, operand: str) -> list[tuple[Any, bool]]:
    """(index into the stored operand, whether that index is transposed to [rows, K]) of each local group."""
    facts = p.family_facts
    starts, ends = p.spans_at(())
    views = []
    for local, g in enumerate(p.local_groups):
        lo, hi = (int(starts[g]), int(ends[g])) if facts.takes_sizes else (0, 0)
        # lhs stored [rows, K], rhs stored [K, N]: transposed to [N, K] (each with a leading group axis if grouped)
        views.append((facts.index(operand, local, lo, hi), operand == "rhs"))
    return views


def _quantize(p: Problem, operand: str, q: MXQuantizer) -> tuple[np.ndarray, np.ndarray]:
    values = getattr(p, operand).astype(np.float64)
    # every element gets a code (unread ones too, row by row over the whole array), then each group's own
    codes = np.zeros(values.shape, q.elem)
    whole = values if operand == "lhs" else np.swapaxes(values, -1, -2)
    flat_codes, _ = q.quantize(whole.reshape(-1, whole.shape[-1]))
    codes[...] = flat_codes.reshape(whole.shape) if operand == "lhs" else np.swapaxes(
        flat_codes.reshape(whole.shape), -1, -2)
    views = [(idx, transposed, values[idx].T if transposed else values[idx]) for idx, transposed in _views(p, operand)]
    shared = None
    if getattr(q, "across_groups", False) and views:  # one amax per block position over every group
        amaxes = [q.block_amax(block) for _, _, block in views]
        if len({a.shape for a in amaxes}) > 1:
            raise ValueError(f"{operand}: across_groups needs every group's [rows, K] view to share its block grid "
                             f"(got {sorted({a.shape for a in amaxes})})")
        shared = np.max(np.stack(amaxes), axis=0)
    scales = []
    for idx, transposed, block in views:
        c, s = q.quantize(block) if shared is None else q.quantize(block, shared)
        codes[idx] = c.T if transposed else c
        scales.append(s.reshape(-1))
    flat = np.concatenate(scales) if scales else np.zeros(0, q.quantization.scale)
    return codes, flat.astype(q.quantization.scale)
