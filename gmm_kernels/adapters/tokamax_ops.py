"""tokamax ``ragged_dot`` (lax signature plus ``implementation=``).

``"xla"`` runs anywhere (it calls ``lax.ragged_dot_general`` accumulating in
at least float32, then casts). ``"mosaic"`` (Mosaic GPU sm90/sm100, or Mosaic
TPU v5+) and ``"triton"`` (Pallas Triton) raise ``NotImplementedError: Not
supported on cpu``: every op checks ``supported_on(device)`` before running,
so neither the Mosaic TPU op's ``interpret=True`` field nor jax's GPU
interpret mode can reach them on a CPU. ``"xla"`` also takes qwix QArray operands
(:class:`TokamaxQArrayRaggedDot`, in the ``qwix.ragged_dot`` convention).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from gmm_kernels.adapters.qwix import as_qarray, to_jax
from gmm_kernels.base import KernelAdapter, VariantAdapter
from gmm_kernels.convert import jax_x64, uses_64bit
from gmm_ref import Numerics

__all__ = ["TokamaxQArrayRaggedDot", "TokamaxRaggedDot"]

_NEEDS = {
    "mosaic": "a Hopper/Blackwell GPU (Mosaic GPU) or a TPU v5+ (Mosaic TPU)",
    "triton": "a GPU (Pallas Triton)",
}


def _absl_flags_parsed() -> None:
    """Parse absl flags with defaults only, unless the application already did.

    tokamax reads its config flags on first use and, if absl has not parsed
    the command line, calls ``flags.FLAGS(sys.argv)``: under pytest (or any
    program with its own options) that raises ``UnrecognizedFlagError: Unknown
    command line flag 'q'``. Parsing just the program name keeps the defaults.
    """
    import sys

    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS(sys.argv[:1])


@functools.cache
def _jitted(implementation: str, preferred_element_type: Any) -> Any:
    import jax
    import tokamax

    _absl_flags_parsed()

    return jax.jit(lambda a, b, g: tokamax.ragged_dot(
        a, b, g, preferred_element_type=preferred_element_type, implementation=implementation))


class TokamaxRaggedDot(VariantAdapter):
    """``tokamax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=..., implementation=...)``."""

    family = "tokamax.ragged_dot"
    implementations = ("xla", *_NEEDS)
    xla_via = "tokamax 0.0.12 implementation='xla' calls lax.ragged_dot_general"
    convention = "ragged_dot"
    requires = ("jax", "tokamax")
    flush_subnormals = True
    default_precision = True

    def _unavailable(self) -> str | None:
        if self.implementation == "xla":
            return None
        import jax

        if jax.default_backend() == "cpu":
            return (f"tokamax {self.implementation!r} needs {_NEEDS[self.implementation]}; on CPU "
                    "it raises NotImplementedError('Not supported on cpu') and has no interpret mode")
        return None

    def differentiable_fn(self) -> Any:
        import tokamax

        _absl_flags_parsed()
        return functools.partial(tokamax.ragged_dot, implementation=self.implementation)

    def _refusal(self, problem: Any) -> str | None:
        if self.implementation == "mosaic" and min(problem.m, problem.k, problem.n) < 128:
            return "tokamax Mosaic TPU needs every non-group dimension >= 128"
        return None

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, precision: Any = None,
             preferred_element_type: Any = None) -> np.ndarray:
        if precision is not None:
            raise ValueError("this adapter runs the default precision only")
        ped = None if preferred_element_type is None else np.dtype(preferred_element_type)
        with jax_x64(uses_64bit(lhs, rhs, ped)):
            out = _jitted(self.implementation, ped)(lhs, rhs, np.asarray(group_sizes, np.int32))
            return np.asarray(out)


@functools.cache
def _jitted_qarray(preferred_element_type: Any) -> Any:
    import jax
    import tokamax

    _absl_flags_parsed()
    return jax.jit(lambda a, b, g: tokamax.ragged_dot(
        as_qarray(a), as_qarray(b), g, preferred_element_type=preferred_element_type, implementation="xla"))


class TokamaxQArrayRaggedDot(KernelAdapter):
    """``tokamax.ragged_dot(..., implementation="xla")`` with QArray operands (``qwix.ragged_dot`` convention).

    tokamax 0.0.12's XLA op dequantizes each QArray first (``quantization.as_array``: code * scale in the scale's
    dtype, float32 here), then calls ``lax.ragged_dot_general`` accumulating in float32."""

    name = "tokamax.ragged_dot[xla,QArray]"
    convention = "qwix.ragged_dot"
    requires = ("jax", "tokamax", "qwix")

    @property
    def known_issues(self) -> Any:  # type: ignore[override]
        from gmm_kernels.known_issues import xla_nan_leak_issues

        return xla_nan_leak_issues("tokamax 0.0.12 implementation='xla' calls lax.ragged_dot_general")

    def numerics_for(self, problem: Any) -> Numerics:
        """Dequantized values (code * float32 scale, rounded once) multiplied in float32."""
        if self.scope is not None and self.scope.numerics is not None:
            return self.scope.numerics
        return Numerics(multiply="float32", accumulate="float32", flush_subnormals=True)

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, precision: Any = None, preferred_element_type: Any = None,
             group_offset: Any = None) -> np.ndarray:
        if precision is not None or group_offset is not None:
            raise ValueError("this adapter runs the default precision and no group_offset")
        ped = None if preferred_element_type is None else np.dtype(preferred_element_type)
        return np.asarray(_jitted_qarray(ped)(to_jax(lhs), to_jax(rhs), np.asarray(group_sizes, np.int32)))
