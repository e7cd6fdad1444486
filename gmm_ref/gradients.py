"""Exact gradients of a grouped GEMM, as grouped GEMM problems of their own.

The reverse-mode gradients of ``out = op(lhs) @ op(rhs)`` (per group) are
grouped GEMMs on the cotangent ``dout``: for ragged M, ``dlhs_g = dout_g @
rhs_g^T`` (ragged M again) and ``drhs_g = lhs_g^T @ dout_g`` (ragged K over
the same sizes). :func:`gradients` builds, for a forward :class:`Problem`
and a cotangent, one :class:`Problem` per input whose reference *is* that
gradient, so :func:`gmm_ref.reference`, the bounds, :func:`gmm_ref.check` and
:func:`gmm_ref.assert_matches_reference` (with the group / tile report) apply
unchanged::

    grads = gmm_ref.gradients(problem, dout)
    gmm_ref.assert_matches_reference(dlhs, grads.lhs, numerics=..., kernel="k dlhs")

Gradient w.r.t. ``existing_out`` (not a GEMM): with ``overwrite`` it is
``dout`` on the rows (columns) the kernel did not compute and 0 on those it
did; with ``accumulate`` it is ``dout``. It is expressed as a problem with
all-zero operands and ``existing_out=dout``, whose reference is exactly that,
bit for bit (bound 0).

Elements of ``lhs`` (``rhs``) that no local group reads have gradient 0.
Where the forward problem's ``tail`` / ``foreign`` policy leaves output rows
undefined, the same rows of the input gradient follow the same policy (a
kernel whose backward reuses its forward kernel, as megablox's does, leaves
them unwritten too); pass ``tail="zero"`` to demand the true gradient, 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gmm_ref import dtypes as _dt
from gmm_ref import families as _families
from gmm_ref.problem import Problem

__all__ = ["Gradients", "gradients"]

WRT = ("lhs", "rhs", "existing_out")


@dataclass(frozen=True)
class Gradients:
    """The gradient problems of one forward problem and cotangent.

    ``lhs``, ``rhs`` and ``existing_out`` are :class:`Problem` s whose
    reference is the gradient w.r.t. that input, stored like the input
    (same shape and layout; dtype: the input's). ``existing_out`` is None when
    the forward problem has none.
    """

    problem: Problem
    cotangent: np.ndarray
    lhs: Problem
    rhs: Problem
    existing_out: Problem | None

    def __getitem__(self, wrt: str) -> Problem:
        if wrt not in WRT:
            raise KeyError(f"wrt: expected one of {WRT}, got {wrt!r}")
        p = getattr(self, wrt)
        if p is None:
            raise KeyError(f"wrt={wrt!r}: the forward problem has no existing_out")
        return p

    def items(self) -> list[tuple[str, Problem]]:
        """``(input name, gradient problem)`` for every input that has a gradient."""
        return [(w, getattr(self, w)) for w in WRT if getattr(self, w) is not None]


def gradients(problem: Problem, cotangent: Any, *, tail: str | None = None,
              foreign: str | None = None) -> Gradients:
    """The gradient problems of ``problem`` for ``cotangent`` (shape and dtype of the output).

    ``tail`` / ``foreign`` (``"zero"`` or ``"undefined"``) say what the rows
    of ``dlhs`` / ``drhs`` outside every (local) group must hold; default: the
    forward problem's policies (see the module docstring). Packed layouts are
    not supported (NotImplementedError).
    """
    p = problem
    if not isinstance(p, Problem):
        raise TypeError(f"problem: expected a gmm_ref.Problem, got {type(p).__name__}")
    dout = _cotangent(p, cotangent)
    tail = p.tail if tail is None else tail
    foreign = p.foreign if foreign is None else foreign
    common = dict(
        batch_ndim=p.batch_ndim, tiling=p.tiling, group_offset=p.group_offset,
        num_local_groups=p.num_local_groups,
    )
    if not p.family_facts.takes_sizes:
        common = dict(batch_ndim=p.batch_ndim, tiling=p.tiling)
    policies = dict(tail=tail, foreign=foreign, empty="zero")
    gs = p.group_sizes
    dl, dr = _operands(p, dout)
    d_lhs = _problem(dl, gs, p.lhs.dtype, common, policies)
    d_rhs = _problem(dr, gs, p.rhs.dtype, common, policies)
    d_ex = None if p.existing_out is None else _existing_gradient(p, dout)
    for want, got, name in ((p.lhs, d_lhs, "lhs"), (p.rhs, d_rhs, "rhs")):
        if got.out_shape != want.shape:  # pragma: no cover - a bug in the tables above
            raise AssertionError(f"gradient of {name}: shape {got.out_shape}, expected {want.shape}")
    return Gradients(p, dout, d_lhs, d_rhs, d_ex)


def _cotangent(p: Problem, cotangent: Any) -> np.ndarray:
    """``cotangent`` as NumPy, checked against the output's shape and dtype."""
    dout = cotangent
    if not isinstance(dout, np.ndarray):
        dout = _dt.as_numpy(dout, name="cotangent")
    if dout.shape != p.out_shape or dout.dtype != p.out_dtype:
        raise ValueError(
            f"cotangent: expected shape {p.out_shape} and dtype {p.out_dtype} (the output's), "
            f"got shape {dout.shape} and dtype {dout.dtype}"
        )
    if _dt.is_integer(p.out_dtype):
        raise TypeError("cotangent: integer problems have no gradients")
    if p.scaled:
        raise NotImplementedError("gradients: scaled (quantized) problems have no gradient model here (codes are "
                                  "not differentiable; a quantized kernel's backward is its own scaled GEMM)")
    if dout.dtype not in _dt.INPUT_DTYPES:
        raise TypeError(f"cotangent: dtype {dout.dtype} cannot be a grouped GEMM input")
    if p.packed:
        raise NotImplementedError("gradients: packed layouts are not supported")
    if p.family_facts.gradient is None:
        raise NotImplementedError(f"gradients: the {p.family} family has no gradient model here (its kernels are "
                                  "inference kernels)")
    return dout


def _operands(p: Problem, dout: np.ndarray) -> tuple[tuple, tuple]:
    """dlhs and drhs of ``p`` as (family, lhs buffer, rhs buffer, lhs_transposed, rhs_transposed)."""
    lt, rt = p.lhs_transposed, p.rhs_transposed
    facts = p.family_facts
    # dlhs = dout @ rhs^T; stored transposed, dlhs^T = rhs @ dout^T. drhs = lhs^T @ dout; stored transposed,
    # drhs^T = dout^T @ lhs. Which family each product is (the groups split the same extents, now on other axes)
    # is the family's fact (Family.gradient), e.g. ragged_m: dlhs [T, K] is ragged_m (stored [K, T]: ragged_n),
    # drhs_g [K, N] = lhs_g^T [K, m_g] @ dout_g [m_g, N] is ragged_k.
    # An operand's "transposed" flag flips when the gradient reads it transposed.
    dl = ((facts.gradient_family("lhs", False), dout, p.rhs, False, not rt) if not lt
          else (facts.gradient_family("lhs", True), p.rhs, dout, rt, True))
    dr = ((facts.gradient_family("rhs", False), p.lhs, dout, not lt, False) if not rt
          else (facts.gradient_family("rhs", True), dout, p.lhs, True, lt))
    return dl, dr


def _problem(operands: tuple, gs: Any, out_dtype: Any, common: dict, policies: dict) -> Problem:
    fam, a, b, at, bt = operands
    kw = dict(common)
    if not _families.get(fam).takes_sizes:
        return Problem(fam, a, b, None, lhs_transposed=at, rhs_transposed=bt, out_dtype=out_dtype, **kw)
    return Problem(fam, a, b, gs, lhs_transposed=at, rhs_transposed=bt, out_dtype=out_dtype,
                   **policies, **kw)


def _existing_gradient(p: Problem, dout: np.ndarray) -> Problem:
    """``dout`` on elements the forward kept from ``existing_out``, 0 on those it overwrote.

    Built as the same grouping with all-zero operands writing into
    ``existing_out=dout`` (``overwrite``): computed elements become exactly 0,
    the others keep ``dout``, and the bound is 0 (bit for bit). With
    ``accumulate`` every element of ``existing_out`` reaches the output with
    weight 1, so no group computes anything: all sizes are 0 (ragged K:
    ``empty='untouched'`` blocks, which keep ``existing_out``).
    """
    kw = dict(batch_ndim=p.batch_ndim, tiling=p.tiling, out_dtype=p.out_dtype,
              existing_out=dout, existing_policy="overwrite")
    if p.existing_policy == "accumulate":
        sizes_shape = (p.num_groups,) if p.group_sizes is None else p.group_sizes.shape
        zeros = np.zeros(sizes_shape, np.int64)
        if p.family_facts.ragged_out:  # ragged_m, ragged_n: every output element keeps existing_out
            return Problem(p.family, np.zeros(_zero_shape(p, "lhs"), np.float32),
                           np.zeros(_zero_shape(p, "rhs"), np.float32), zeros,
                           group_offset=p.group_offset, num_local_groups=p.num_local_groups, **kw)
        b, (m, n) = p.out_shape[1:-2], p.out_shape[-2:]
        # ragged_k (and batch): G empty contraction groups, each block untouched
        return Problem("ragged_k", np.zeros((*b, m, 0), np.float32), np.zeros((*b, 0, n), np.float32),
                       zeros, empty="untouched", group_offset=p.group_offset,
                       num_local_groups=p.num_local_groups, **kw)
    zl = np.zeros(_zero_shape(p, "lhs"), np.float32)
    zr = np.zeros(_zero_shape(p, "rhs"), np.float32)
    if not p.family_facts.takes_sizes:
        return Problem(p.family, zl, zr, None, **kw)
    return Problem(p.family, zl, zr, p.group_sizes, group_offset=p.group_offset,
                   num_local_groups=p.num_local_groups, empty=p.empty, **kw)


def _zero_shape(p: Problem, which: str) -> tuple[int, ...]:
    """Canonical (untransposed) operand shape of ``p`` with contraction length 1 (ragged K: T)."""
    facts = p.family_facts
    k = p.k if facts.ragged_contraction else 1
    return facts.shape(which, p.m, k, p.n, p.num_local_groups, p.batch_shape)
