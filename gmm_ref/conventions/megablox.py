"""megablox ``gmm`` / ``tgmm`` (``jax.experimental.pallas.ops.tpu.megablox``; ejkernel's copies too).

- ``gmm``: rows past ``sum(group_sizes)`` are never written (undefined) unless
  ``existing_out`` is given, which every row not computed keeps; rows of groups
  outside ``[group_offset, group_offset + rhs.shape[0])`` are zero without it.
- ``tgmm``: empty groups give zero blocks; ``existing_out`` is accumulated into;
  with ``group_offset`` but no ``num_actual_groups`` the output has G slots of
  which the last ``group_offset`` are never written.

Both need the ragged extent to be a multiple of the row tile ``tm``
(megablox raises ValueError otherwise), and no extent may be 0 (megablox
slices a tile of every operand; a zero-length one fails in ``lax.slice``).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from gmm_ref.conventions import base
from gmm_ref.conventions.base import Convention
from gmm_ref.exact import Reference, reference
from gmm_ref.numerics import Numerics
from gmm_ref.problem import Problem

__all__ = ["DEFAULT_TILING", "GMM", "TGMM", "gmm", "tgmm"]

_PAIRS = (("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "bfloat16"))
#: megablox's tiling ``(TM, TK, TN)`` when none is given: the conventions' ``default_tiling``, and the default of
#: the adapters' calls (``gmm_kernels.adapters.megablox``)
DEFAULT_TILING = (128, 128, 128)


def _group_offset(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        arr = np.asarray(value)
    elif isinstance(value, (np.ndarray, list, tuple)) or type(value).__module__.startswith(("jax", "torch")):
        arr = base.as_array("group_offset", value)
    else:
        arr = np.asarray(0.5)  # not an integer of any kind: refused below
    if not np.issubdtype(arr.dtype, np.integer) or arr.size != 1:
        raise TypeError(f"group_offset: expected an integer scalar or shape-(1,) integer array, got {value!r}")
    return int(arr.reshape(()))


def _existing(value: Any) -> np.ndarray | None:
    return None if value is None else base.as_array("existing_out", value)


def _tiling(value: Any) -> tuple[int, ...] | None:
    return tuple(value) if value is not None and not callable(value) else None


def _common_arguments(conv: Convention, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments gmm and tgmm share, in their order."""
    return (p.lhs, p.rhs, base.sizes32(p)), {
        "preferred_element_type": p.out_dtype,
        "tiling": p.tiling or conv.default_tiling,
        "group_offset": None if p.group_offset == 0 else np.array(p.group_offset, np.int32),
    }


class _Gmm(Convention):
    def parse(self, lhs: Any, rhs: Any, group_sizes: Any, preferred_element_type: Any = np.float32,
              tiling: Any = None, group_offset: Any = None, existing_out: Any = None,
              transpose_rhs: bool = False) -> Problem:
        """megablox ``gmm``: ``lhs [M, K]``, ``rhs [num_local_groups, K, N]`` (``[.., N, K]`` transposed).

        Rows past ``sum(group_sizes)`` are undefined unless ``existing_out`` is
        given (then every row not computed keeps it); rows of groups outside
        ``[group_offset, group_offset + rhs.shape[0])`` are zero without it.
        """
        lhs, rhs = base.as_array("lhs", lhs), base.as_array("rhs", rhs)
        base.expect_ndim("lhs", lhs, 2)
        base.expect_ndim("rhs", rhs, 3)
        gs = base.as_sizes("group_sizes", group_sizes)
        return Problem(
            "ragged_m", lhs, rhs, gs, rhs_transposed=bool(transpose_rhs),
            out_dtype=base.optional_dtype("preferred_element_type", preferred_element_type),
            existing_out=_existing(existing_out), group_offset=_group_offset(group_offset),
            num_local_groups=rhs.shape[0], convention=self.name, tiling=_tiling(tiling),
            **self.policies("ragged_m"),
        )

    def _arguments(self, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args, kwargs = _common_arguments(self, p)
        return args, {**kwargs, "existing_out": p.existing_out, "transpose_rhs": p.rhs_transposed}


class _Tgmm(Convention):
    def parse(self, lhs: Any, rhs: Any, group_sizes: Any, preferred_element_type: Any = np.float32,
              tiling: Any = None, group_offset: Any = None, num_actual_groups: Any = None,
              existing_out: Any = None) -> Problem:
        """megablox ``tgmm``: ``lhs [M, sum K]`` (megablox's ``[k, m]``), ``rhs [sum K, N]`` -> ``[groups, M, N]``.

        Output slot ``i`` holds group ``group_offset + i``; empty groups give
        zeros; ``existing_out`` is accumulated into. Without ``num_actual_groups``
        the output has G slots of which the last ``group_offset`` are undefined.
        """
        lhs, rhs = base.as_array("lhs", lhs), base.as_array("rhs", rhs)
        base.expect_ndim("lhs", lhs, 2)
        base.expect_ndim("rhs", rhs, 2)
        gs = base.as_sizes("group_sizes", group_sizes)
        local, slots = _slots(gs.shape[0], _group_offset(group_offset), num_actual_groups)
        ex = _existing(existing_out)
        if ex is not None and ex.shape[0] != slots:
            raise ValueError(f"existing_out: expected shape {(slots, lhs.shape[0], rhs.shape[1])}, got {ex.shape}")
        return Problem(
            "ragged_k", lhs, rhs, gs, out_dtype=base.optional_dtype("preferred_element_type", preferred_element_type),
            existing_out=None if ex is None else ex[:local], group_offset=_group_offset(group_offset),
            num_local_groups=local, convention=self.name, tiling=_tiling(tiling), **self.policies("ragged_k"),
        )

    def reference(self, *args: Any, **kwargs: Any) -> Reference:
        """The reference of a call; trailing slots the kernel never writes are undefined."""
        p = self.parse(*args, **kwargs)
        ref = reference(p)
        bound = inspect.signature(self.parse).bind(*args, **kwargs)
        nag = bound.arguments.get("num_actual_groups")
        if nag is not None or p.group_offset == 0:
            return ref
        ex = _existing(bound.arguments.get("existing_out"))
        return _PaddedReference(p, ref, p.num_groups, None if ex is None else ex[p.num_local_groups:])

    def _arguments(self, p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
        args, kwargs = _common_arguments(self, p)
        return args, {**kwargs, "num_actual_groups": p.num_local_groups, "existing_out": p.existing_out}


def _slots(g: int, offset: int, nag: Any) -> tuple[int, int]:
    """(local groups, output slots) of a tgmm call."""
    if nag is not None and (not isinstance(nag, (int, np.integer)) or isinstance(nag, bool)
                            or not 0 <= nag <= g - offset):
        raise ValueError(f"num_actual_groups: expected an int in [0, G - group_offset = {g - offset}], got {nag!r}")
    local = int(nag) if nag is not None else g - offset
    return local, (local if nag is not None else g)


class _PaddedReference(Reference):
    """A reference with extra, undefined output slots appended on axis 0 (their values: the
    existing output's where one is given, else 0)."""

    def __init__(self, problem: Problem, inner: Reference, slots: int, existing_tail: np.ndarray | None):
        pad = slots - inner.exact.shape[0]
        exact = np.concatenate([inner.exact, np.zeros((pad, *inner.exact.shape[1:]), inner.exact.dtype)])
        mask = np.concatenate([inner.mask, np.zeros((pad, *inner.mask.shape[1:]), bool)])
        if existing_tail is not None:
            exact[inner.exact.shape[0]:] = existing_tail.astype(exact.dtype)
        super().__init__(problem, exact, mask)
        self._inner = inner

    def bound(self, numerics: Numerics | None = None) -> np.ndarray:
        b = self._inner.bound(numerics)
        return np.concatenate([b, np.zeros((self.exact.shape[0] - b.shape[0], *b.shape[1:]))])


GMM = _Gmm(
    name="megablox.gmm", framework="jax", families=("ragged_m",),
    layouts=(("ragged_m", ((False, False, False), (False, True, False))),), dtype_pairs=_PAIRS,
    tail="undefined", foreign="zero", existing_policy="overwrite", existing_argument="existing_out",
    sharding=True, multiple_of=(("ragged", "tm"),), default_tiling=DEFAULT_TILING, zero_extents=(),
    summary="megablox gmm(lhs [M, K], rhs [L, K, N], group_sizes [G], ...) -> [M, N]",
)
TGMM = _Tgmm(
    name="megablox.tgmm", framework="jax", families=("ragged_k",), layouts=(("ragged_k", base.PLAIN),),
    dtype_pairs=_PAIRS, empty="zero", existing_policy="accumulate", existing_argument="existing_out",
    sharding=True, multiple_of=(("ragged", "tm"),), default_tiling=DEFAULT_TILING, zero_extents=(),
    # megablox's tgmm calls the ragged (contracting) axis m and tiles it by tm
    summary="megablox tgmm(lhs [M, sum K], rhs [sum K, N], group_sizes [G], ...) -> [groups, M, N]",
)
gmm = base.front_end(GMM, "gmm")
tgmm = base.front_end(TGMM, "tgmm")
