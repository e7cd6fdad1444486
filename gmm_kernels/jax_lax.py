"""``jax.lax.ragged_dot`` and ``jax.lax.ragged_dot_general`` on the default (CPU) backend.

Each distinct (shapes, dtypes, dimension numbers) compiles once: the group
sizes are a traced argument. Problems with a 64-bit array or output dtype run
under ``jax.enable_x64(True)`` (without it jax silently computes float64
inputs in float32).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from gmm_ref import Numerics

from gmm_kernels.base import KernelAdapter, missing_module
from gmm_kernels.convert import jax_x64, uses_64bit

__all__ = ["JaxRaggedDot", "JaxRaggedDotGeneral", "lax_dimension_numbers", "jax_numerics"]


def jax_numerics(problem: Any) -> Numerics:
    """Exact products; accumulate in float32, float64 for 64-bit, int32 for integers."""
    return Numerics.default_for(problem.lhs.dtype, problem.rhs.dtype, problem.out_dtype)


def lax_dimension_numbers(dn: Any) -> Any:
    """A ``gmm_ref.RaggedDotDimensionNumbers`` (or any 3-field tuple) as the lax type."""
    from jax import lax

    if isinstance(dn, lax.RaggedDotDimensionNumbers):
        return dn
    (lc, rc), (lb, rb) = dn[0]
    fix = lambda xs: tuple(int(x) for x in xs)  # noqa: E731
    return lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=((fix(lc), fix(rc)), (fix(lb), fix(rb))),
        lhs_ragged_dimensions=fix(dn[1]),
        rhs_group_dimensions=fix(dn[2]),
    )


@functools.cache
def _jitted_ragged_dot(preferred_element_type: Any) -> Any:
    import jax
    from jax import lax

    return jax.jit(lambda a, b, g: lax.ragged_dot(a, b, g, preferred_element_type=preferred_element_type))


@functools.cache
def _jitted_ragged_dot_general(dn_key: Any, preferred_element_type: Any) -> Any:
    import jax
    from jax import lax

    dn = lax_dimension_numbers(dn_key)
    return jax.jit(
        lambda a, b, g: lax.ragged_dot_general(a, b, g, dn, preferred_element_type=preferred_element_type)
    )


def _dn_key(dn: Any) -> tuple:
    (lc, rc), (lb, rb) = dn[0]
    t = lambda xs: tuple(int(x) for x in xs)  # noqa: E731
    return (((t(lc), t(rc)), (t(lb), t(rb))), t(dn[1]), t(dn[2]))


def _ped(x: Any) -> Any:
    return None if x is None else np.dtype(x)


class _JaxBase(KernelAdapter):
    def available(self) -> str | None:
        return missing_module("jax")

    def numerics_for(self, problem: Any) -> Numerics:
        return jax_numerics(problem)

    def supports(self, problem: Any) -> str | None:
        reason = super().supports(problem)
        if reason:
            return reason
        if problem.group_offset != 0 or problem.num_local_groups != problem.num_groups:
            return "lax ragged_dot has no group_offset (NotImplementedError in jax 0.10.2)"
        if problem.existing_out is not None:
            return "lax ragged_dot takes no existing output"
        return None


class JaxRaggedDot(_JaxBase):
    """``jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=...)``."""

    name = "jax.ragged_dot"
    convention = "ragged_dot"

    def supports(self, problem: Any) -> str | None:
        reason = super().supports(problem)
        if reason:
            return reason
        if problem.family != "ragged_m" or problem.batch_ndim:
            return "lax.ragged_dot is ragged M only (use jax.ragged_dot_general)"
        return None

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, precision: Any = None,
             preferred_element_type: Any = None) -> np.ndarray:
        if precision is not None:
            raise ValueError("this adapter runs the default precision only")
        ped = _ped(preferred_element_type)
        with jax_x64(uses_64bit(lhs, rhs, ped)):
            out = _jitted_ragged_dot(ped)(lhs, rhs, np.asarray(group_sizes, np.int32))
            return np.asarray(out)


class JaxRaggedDotGeneral(_JaxBase):
    """``jax.lax.ragged_dot_general`` (modes 1, 2, 3, with batch dims)."""

    name = "jax.ragged_dot_general"
    convention = "ragged_dot_general"

    def supports(self, problem: Any) -> str | None:
        reason = super().supports(problem)
        if reason:
            return reason
        if problem.family == "ragged_n":
            return "ragged_dot_general has no ragged N mode"
        if problem.packed:
            return "ragged_dot_general has no packed layout"
        return None

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, ragged_dot_dimension_numbers: Any,
             precision: Any = None, preferred_element_type: Any = None) -> np.ndarray:
        if precision is not None:
            raise ValueError("this adapter runs the default precision only")
        ped = _ped(preferred_element_type)
        fn = _jitted_ragged_dot_general(_dn_key(ragged_dot_dimension_numbers), ped)
        with jax_x64(uses_64bit(lhs, rhs, ped)):
            return np.asarray(fn(lhs, rhs, np.asarray(group_sizes, np.int32)))
