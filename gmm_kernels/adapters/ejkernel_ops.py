"""ejkernel ``grouped_matmul``: its XLA and Pallas TPU (interpret) implementations.

The public ``ejkernel.modules.grouped_matmul`` autotunes on first use (about
3 s per shape here, printing tracebacks for configs it cannot time) and
dispatches by ``(platform, jax backend)``: ``platform="pallas"`` finds no
implementation for backend ``cpu``. These adapters therefore call the
registered implementations directly:

- ``ejkernel.grouped_matmul[xla]``: ``ejkernel.kernels._xla.grouped_matmul``,
  i.e. ``lax.ragged_dot_general`` (+ ``existing_out`` added: it *accumulates*,
  where megablox overwrites); ``group_offset`` fails (TypeError: unhashable
  jax array); ``tiling`` and ``interpret`` are ignored.
- ``ejkernel.grouped_matmul[pallas]``: ``ejkernel.kernels._pallas.tpu.grouped_matmul``
  (v1), a megablox ``gmm`` copy, run with ``interpret=True``: same semantics
  and constraints as ``megablox.gmm``.
- ``[pallas_v2]`` / ``[pallas_v3]``: call ``pltpu.get_tpu_info()`` which raises
  ``Unsupported TPU device kind: cpu``; v2 also refuses ``existing_out``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gmm_kernels.base import VariantAdapter
from gmm_kernels.convert import device_array, jax_group_offset, jax_x64, uses_64bit
from gmm_kernels.scope import Limits
from gmm_ref import Problem
from gmm_ref.conventions.megablox import DEFAULT_TILING

__all__ = ["EjkernelGroupedMatmul"]

# implementation -> problem feature (gmm_kernels.scope.FEATURES) -> why that implementation takes none of the
# problems that have it
_OPTIONS_REFUSED = {
    "xla": {"sharding": "ejkernel XLA grouped_matmul fails with group_offset (TypeError: unhashable jax array)",
            "existing_out": ("ejkernel XLA grouped_matmul adds existing_out (out = result + existing_out); "
                             "the megablox convention overwrites")},
    "pallas_v2": {"existing_out": "ejkernel grouped_matmulv2 raises NotImplementedError for existing_out"},
}

_KERNELS = {
    "xla": ("ejkernel.kernels._xla.grouped_matmul", "grouped_matmul"),
    "pallas": ("ejkernel.kernels._pallas.tpu.grouped_matmul", "grouped_matmul"),
    "pallas_v2": ("ejkernel.kernels._pallas.tpu.grouped_matmulv2", "grouped_matmulv2"),
    "pallas_v3": ("ejkernel.kernels._pallas.tpu.grouped_matmulv3", "grouped_matmulv3"),
}


def _kernel(impl: str) -> Any:
    import importlib

    mod, fn = _KERNELS[impl]
    return getattr(importlib.import_module(mod), fn)


class EjkernelGroupedMatmul(VariantAdapter):
    """ejkernel grouped matmul in the ``megablox.gmm`` convention."""

    family = "ejkernel.grouped_matmul"
    implementations = tuple(_KERNELS)
    xla_via = "ejkernel 0.0.80.3's XLA grouped_matmul calls lax.ragged_dot_general"
    convention = "megablox.gmm"
    requires = ("jax", "ejkernel")
    flush_subnormals = True
    default_precision = True

    def __init__(self, implementation: str = "xla") -> None:
        super().__init__(implementation)
        if implementation != "xla":  # megablox gmm copies: megablox's dtype rules
            self.input_dtypes = ("float32", "bfloat16")  # type: ignore[misc]
            self.output_dtypes = ("float32", "bfloat16", "float16")  # type: ignore[misc]
        else:
            self.input_dtypes = ("float64", "float32", "bfloat16", "float16")  # type: ignore[misc]  # jaxtyping Float

    def large_refusal(self) -> str | None:
        if self.implementation == "xla":
            return None
        return self._runs_interpreted()

    def _unavailable(self) -> str | None:
        if self.implementation.startswith("pallas_v"):
            import jax

            if jax.default_backend() != "tpu":
                return (f"ejkernel {self.implementation} needs a TPU: pltpu.get_tpu_info() raises "
                        "'Unsupported TPU device kind: cpu' even with interpret=True")
        try:
            _kernel(self.implementation)
        except Exception as e:  # noqa: BLE001
            return f"cannot import ejkernel {self.implementation}: {type(e).__name__}: {e}"
        return None

    def _refusal(self, problem: Problem) -> str | None:
        sharded = problem.group_offset != 0 or problem.num_local_groups != problem.num_groups
        for option, drawn in (("sharding", sharded), ("existing_out", problem.existing_out is not None)):
            why = self.option_refusal(option) if drawn else None
            if why is not None:
                return why
        return None

    def option_refusal(self, option: str) -> str | None:
        return _OPTIONS_REFUSED.get(self.implementation, {}).get(option)

    def _limits(self) -> Limits:
        """What :meth:`_refusal` declines, left out of the designs (so no draw is spent on it, and the
        modes that need it say why they do not apply)."""
        return Limits(refuses=tuple(_OPTIONS_REFUSED.get(self.implementation, {})))

    def call(self, lhs: Any, rhs: Any, group_sizes: Any, preferred_element_type: Any = np.float32,
             tiling: Any = DEFAULT_TILING, group_offset: Any = None, existing_out: Any = None,
             transpose_rhs: bool = False) -> np.ndarray:
        ped = np.dtype(preferred_element_type)
        with jax_x64(uses_64bit(lhs, rhs, ped)):
            kw: dict[str, Any] = dict(
                preferred_element_type=ped, tiling=tuple(int(t) for t in tiling),
                group_offset=jax_group_offset(group_offset),
                existing_out=None if existing_out is None else device_array(np.asarray(existing_out)),
                transpose_rhs=bool(transpose_rhs),
            )
            if self.implementation != "xla":
                kw["interpret"] = True
            out = _kernel(self.implementation)(
                device_array(np.asarray(lhs)), device_array(np.asarray(rhs)),
                device_array(np.asarray(group_sizes, np.int32)), **kw)
            return np.asarray(out)
