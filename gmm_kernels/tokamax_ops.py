"""tokamax ``ragged_dot`` (lax signature plus ``implementation=``).

``"xla"`` runs anywhere (it calls ``lax.ragged_dot_general`` accumulating in
at least float32, then casts). ``"mosaic"`` (Mosaic GPU sm90/sm100, or Mosaic
TPU v5+) and ``"triton"`` (Pallas Triton) raise ``NotImplementedError: Not
supported on cpu``: every op checks ``supported_on(device)`` before running,
so neither the Mosaic TPU op's ``interpret=True`` field nor jax's GPU
interpret mode can reach them on a CPU.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from gmm_kernels.base import VariantAdapter
from gmm_kernels.convert import jax_x64, uses_64bit

__all__ = ["TokamaxRaggedDot"]

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
