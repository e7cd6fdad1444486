"""Argument checks of the problem model: named errors for bad fields, and the derived values validation needs
(the output dtype, a shard, a tiling, the aligned group starts of the ``padded_contiguous`` family)."""

from __future__ import annotations

from typing import Any

import numpy as np

from gmm_ref import dtypes as _dt

__all__ = ["aligned_starts", "as_int", "as_tiling", "choice", "convention_name", "frozen_copy",
           "output_dtype", "set_field", "shard_of"]


def aligned_starts(sizes: np.ndarray, alignment: int) -> np.ndarray:
    """The first row of each group of a ``padded_contiguous`` layout: group 0 at row 0, group g at the end of
    group g - 1 rounded up to a multiple of ``alignment`` (int64, one per group)."""
    sizes = np.asarray(sizes, np.int64)
    padded = -(-sizes // alignment) * alignment
    return np.concatenate([[0], np.cumsum(padded)[:-1]]).astype(np.int64) if sizes.size else np.zeros(0, np.int64)


def choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {allowed}, got {value!r}")


def as_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    arr = np.asarray(value)
    if arr.size != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name}: expected an integer, got {value!r}")
    return int(arr.reshape(()))


def set_field(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # validation normalises fields of the frozen dataclass


def frozen_copy(arr: np.ndarray) -> np.ndarray:
    """A read-only copy: nothing the caller (or a kernel) does to its array changes the problem."""
    out = np.array(arr, copy=True)
    out.flags.writeable = False
    return out


def convention_name(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"convention: expected a convention name (str) or None, got {type(value).__name__}")
    return value  # the name is checked where a convention is looked up: gmm_ref.conventions.get, its registry


def output_dtype(lhs: np.dtype, rhs: np.dtype, out_dtype: Any, scaled: bool = False) -> np.dtype:
    """The output dtype: given, or int32 for integer inputs, else the inputs' common type."""
    if scaled:
        if out_dtype is None:
            raise TypeError("out_dtype: required for a scaled problem (scaled kernels name their output dtype)")
        out = _dt.as_dtype(out_dtype, name="out_dtype")
        if _dt.is_integer(out) or out not in _dt.OUTPUT_DTYPES:
            raise TypeError(f"out_dtype: a scaled problem gives a float output, one of "
                            f"{[str(d) for d in _dt.OUTPUT_DTYPES if not _dt.is_integer(d)]}, got {out}")
        return out
    if out_dtype is not None:
        out = _dt.as_dtype(out_dtype, name="out_dtype")
    elif _dt.is_integer(lhs):
        out = np.dtype(np.int32)
    else:
        try:
            out = np.promote_types(lhs, rhs)
        except TypeError:  # e.g. float8_e4m3fn with float8_e5m2
            raise TypeError(
                f"out_dtype: required, since lhs dtype {lhs} and rhs dtype {rhs} have no common type"
            ) from None
    if out not in _dt.OUTPUT_DTYPES:
        raise TypeError(
            f"out_dtype: unsupported output dtype {out}; expected one of {[str(d) for d in _dt.OUTPUT_DTYPES]}"
        )
    if _dt.is_integer(out) != _dt.is_integer(lhs):
        raise TypeError(
            f"out_dtype: {out} does not fit inputs of dtype {lhs} "
            "(integer inputs give int32, float inputs a float dtype)"
        )
    return out


def shard_of(g: int, group_offset: Any, num_local_groups: Any) -> tuple[int, int]:
    """Validated ``(group_offset, num_local_groups)`` of G groups."""
    off = as_int("group_offset", group_offset)
    if not 0 <= off <= g:
        raise ValueError(f"group_offset: expected 0 <= group_offset <= G={g}, got {off}")
    nl = as_int("num_local_groups", num_local_groups, allow_none=True)
    if nl is None:
        nl = g - off
    if nl < 0 or off + nl > g:
        raise ValueError(
            f"num_local_groups: expected 0 <= num_local_groups <= G - group_offset = {g - off}, got {nl}"
        )
    return off, nl


def as_tiling(value: Any, *, name: str = "tiling") -> tuple[int, int, int]:
    """``(tm, tk, tn)`` from three positive ints or a ``"TM,TK,TN"`` string; ValueError naming ``name``."""
    expected = f"{name}: expected three positive ints (tm, tk, tn)"
    parts: Any = value
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        try:
            parts = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"{expected} such as 128,128,128, got {value!r}") from None
    try:
        t = tuple(parts)
    except TypeError:
        raise ValueError(f"{expected}, got {value!r}") from None
    if len(t) != 3 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
                              and v > 0 for v in t):
        raise ValueError(f"{expected}, got {value!r}")
    return (int(t[0]), int(t[1]), int(t[2]))
