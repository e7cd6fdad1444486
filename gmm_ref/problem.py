"""The problem model: one immutable, validated description of a grouped GEMM.

Canonical storage (``b...`` are the batch dims, ``T`` the ragged extent,
``L`` the number of local groups; a *transposed* operand swaps its two
trailing axes):

============  ======================  ======================  =====================
family        lhs                     rhs                     out
============  ======================  ======================  =====================
``ragged_m``  ``[b..., T, K]``        ``[L, b..., K, N]``     ``[b..., T, N]``
``ragged_n``  ``[L, b..., M, K]``     ``[b..., K, T]``        ``[b..., M, T]``
``ragged_k``  ``[b..., M, T]``        ``[b..., T, N]``        ``[L, b..., M, N]``
``batch``     ``[G, b..., M, K]``     ``[G, b..., K, N]``     ``[G, b..., M, N]``
============  ======================  ======================  =====================

An operand whose ragged axis is its last (fast) axis is stored either
*strided* (group g is a column slice of the whole matrix, ``packed=False``) or
*packed* (group g is its own contiguous row-major ``(rows, size_g)`` block,
one after the other, ``packed=True``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from gmm_ref import dtypes as _dt

if TYPE_CHECKING:
    from gmm_ref.reference import Reference

__all__ = ["FAMILIES", "Problem"]

FAMILIES = ("ragged_m", "ragged_n", "ragged_k", "batch")
TAIL_POLICIES = ("zero", "undefined")
EMPTY_POLICIES = ("zero", "untouched", "undefined")
EXISTING_POLICIES = ("overwrite", "accumulate")

Family = Literal["ragged_m", "ragged_n", "ragged_k", "batch"]


def _choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}: expected one of {allowed}, got {value!r}")


def _as_int(name: str, value: Any, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    arr = np.asarray(value)
    if arr.size != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name}: expected an integer, got {value!r}")
    return int(arr.reshape(()))


@dataclass(frozen=True, eq=False)
class Problem:
    """A grouped GEMM: operands as stored, group sizes, layouts and policies.

    ``tail`` says what the rows (columns) past ``sum(sizes)`` of a ragged
    output hold; ``foreign`` the same for rows of groups outside the local
    shard; ``empty`` what an empty group's ``[M, N]`` block holds in
    ``ragged_k``. With ``existing_out``, every output element not computed
    keeps its value (``overwrite``) or the result is added to it
    (``accumulate``).
    """

    family: Family
    lhs: np.ndarray
    rhs: np.ndarray
    group_sizes: np.ndarray | None
    lhs_transposed: bool = False
    rhs_transposed: bool = False
    packed: bool = False
    batch_ndim: int = 0
    out_dtype: Any = None
    tail: str = "zero"
    foreign: str = "zero"
    empty: str = "zero"
    existing_out: np.ndarray | None = None
    existing_policy: str = "overwrite"
    group_offset: int = 0
    num_local_groups: int | None = None
    convention: str | None = None
    tiling: tuple[int, int, int] | None = None

    # ---------------------------------------------------------------- validation
    def __post_init__(self) -> None:
        set_ = object.__setattr__
        _choice("family", self.family, FAMILIES)
        _choice("tail", self.tail, TAIL_POLICIES)
        _choice("foreign", self.foreign, TAIL_POLICIES)
        _choice("empty", self.empty, EMPTY_POLICIES)
        _choice("existing_policy", self.existing_policy, EXISTING_POLICIES)
        for name in ("lhs", "rhs"):
            arr = getattr(self, name)
            if not isinstance(arr, np.ndarray):
                raise TypeError(f"{name}: expected a numpy.ndarray, got {type(arr).__name__}")
            if arr.dtype not in _dt.INPUT_DTYPES:
                raise TypeError(
                    f"{name}: unsupported dtype {arr.dtype}; expected one of "
                    f"{[str(d) for d in _dt.INPUT_DTYPES]}"
                )
        if _dt.is_integer(self.lhs.dtype) != _dt.is_integer(self.rhs.dtype):
            raise TypeError(
                f"lhs/rhs: integer and floating inputs cannot be mixed "
                f"(got {self.lhs.dtype} and {self.rhs.dtype})"
            )
        for name in ("lhs_transposed", "rhs_transposed", "packed"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"{name}: expected a bool, got {getattr(self, name)!r}")
        nb = _as_int("batch_ndim", self.batch_ndim)
        if nb < 0:
            raise ValueError(f"batch_ndim: expected >= 0, got {nb}")
        set_(self, "batch_ndim", nb)
        if self.out_dtype is None:
            if _dt.is_integer(self.lhs.dtype):
                out = np.dtype(np.int32)
            else:
                try:
                    out = np.promote_types(self.lhs.dtype, self.rhs.dtype)
                except TypeError:  # e.g. float8_e4m3fn with float8_e5m2
                    raise TypeError(
                        f"out_dtype: required, since lhs dtype {self.lhs.dtype} and rhs dtype "
                        f"{self.rhs.dtype} have no common type"
                    ) from None
        else:
            out = _dt.as_dtype(self.out_dtype, name="out_dtype")
        if out not in _dt.OUTPUT_DTYPES:
            raise TypeError(
                f"out_dtype: unsupported output dtype {out}; expected one of "
                f"{[str(d) for d in _dt.OUTPUT_DTYPES]}"
            )
        if _dt.is_integer(out) != _dt.is_integer(self.lhs.dtype):
            raise TypeError(
                f"out_dtype: {out} does not fit inputs of dtype {self.lhs.dtype} "
                "(integer inputs give int32, float inputs a float dtype)"
            )
        set_(self, "out_dtype", out)
        self._check_shapes()
        if self.existing_out is not None:
            ex = self.existing_out
            if not isinstance(ex, np.ndarray):
                raise TypeError(f"existing_out: expected a numpy.ndarray, got {type(ex).__name__}")
            if ex.shape != self.out_shape or ex.dtype != self.out_dtype:
                raise ValueError(
                    f"existing_out: expected shape {self.out_shape} and dtype {self.out_dtype}, "
                    f"got shape {ex.shape} and dtype {ex.dtype}"
                )
        if self.tiling is not None:
            t = tuple(self.tiling)
            if len(t) != 3 or not all(isinstance(v, (int, np.integer)) and v > 0 for v in t):
                raise ValueError(f"tiling: expected three positive ints (tm, tk, tn), got {self.tiling!r}")
            set_(self, "tiling", tuple(int(v) for v in t))

    def _check_shapes(self) -> None:
        set_ = object.__setattr__
        fam, nb = self.family, self.batch_ndim
        lhs, rhs = self.lhs, self.rhs
        grouped_lhs = fam in ("ragged_n", "batch")
        grouped_rhs = fam in ("ragged_m", "batch")
        want_l = nb + 2 + grouped_lhs
        want_r = nb + 2 + grouped_rhs
        if lhs.ndim != want_l:
            raise ValueError(f"lhs: expected {want_l} dims for family {fam!r} with batch_ndim={nb}, got shape {lhs.shape}")
        if rhs.ndim != want_r:
            raise ValueError(f"rhs: expected {want_r} dims for family {fam!r} with batch_ndim={nb}, got shape {rhs.shape}")
        lb = lhs.shape[grouped_lhs:grouped_lhs + nb]
        rb = rhs.shape[grouped_rhs:grouped_rhs + nb]
        if lb != rb:
            raise ValueError(f"lhs/rhs: batch dims differ: {lb} vs {rb}")
        l2 = lhs.shape[-2:] if not self.lhs_transposed else lhs.shape[-2:][::-1]
        r2 = rhs.shape[-2:] if not self.rhs_transposed else rhs.shape[-2:][::-1]
        (m, k), (k2, n) = l2, r2
        if k != k2:
            raise ValueError(f"lhs/rhs: contracting extents differ: lhs has K={k}, rhs has K={k2}")
        if self.packed and not any(self._ragged_last(op) for op in ("lhs", "rhs")):
            raise ValueError("packed: True, but no operand of this problem is ragged along its last axis")
        set_(self, "_mkn", (m, k, n))
        set_(self, "_batch_shape", tuple(lb))
        # groups
        if fam == "batch":
            g = lhs.shape[0]
            if rhs.shape[0] != g:
                raise ValueError(f"rhs: expected {g} groups on axis 0 (as lhs), got {rhs.shape[0]}")
            if self.group_offset != 0 or self.num_local_groups not in (None, g):
                raise ValueError("group_offset/num_local_groups: the batch family has no sharding")
            set_(self, "group_sizes", None)
            set_(self, "group_offset", 0)
            set_(self, "num_local_groups", g)
            set_(self, "_G", g)
            return
        gs = self.group_sizes
        if gs is None:
            raise ValueError(f"group_sizes: required for family {fam!r}")
        gs = np.asarray(gs)
        if gs.ndim == 0 or not (np.issubdtype(gs.dtype, np.integer)):
            raise TypeError(f"group_sizes: expected an integer array of shape [G] or [b..., G], got dtype {gs.dtype} shape {gs.shape}")
        if gs.ndim != 1 and gs.shape[:-1] != self._batch_shape:
            want = "[G]" if not self._batch_shape else f"[G] or {list(self._batch_shape) + ['G']}"
            raise ValueError(f"group_sizes: expected shape {want}, got {gs.shape}")
        if np.any(gs < 0):
            raise ValueError(f"group_sizes: must be non-negative, got {gs.tolist()}")
        g = gs.shape[-1]
        extent = {"ragged_m": m, "ragged_n": n, "ragged_k": k}[fam]
        if np.any(gs > extent):  # checked first: a sum of huge sizes could wrap around
            raise ValueError(
                f"group_sizes: size {int(np.max(gs))} exceeds the ragged extent {extent} ({fam[-1].upper()})"
            )
        totals = gs.astype(np.int64).sum(axis=-1)
        if np.any(totals > extent):
            raise ValueError(
                f"group_sizes: sum {int(np.max(totals))} exceeds the ragged extent "
                f"{extent} ({fam[-1].upper()})"
            )
        off = _as_int("group_offset", self.group_offset)
        if not 0 <= off <= g:
            raise ValueError(f"group_offset: expected 0 <= group_offset <= G={g}, got {off}")
        nl = _as_int("num_local_groups", self.num_local_groups, allow_none=True)
        if nl is None:
            nl = g - off
        if nl < 0 or off + nl > g:
            raise ValueError(
                f"num_local_groups: expected 0 <= num_local_groups <= G - group_offset = {g - off}, got {nl}"
            )
        set_(self, "group_offset", off)
        set_(self, "num_local_groups", nl)
        set_(self, "_G", g)
        gs = np.array(gs, dtype=np.int64)
        gs.setflags(write=False)
        set_(self, "group_sizes", gs)
        if fam == "ragged_m" and rhs.shape[0] != nl:
            raise ValueError(f"rhs: expected {nl} local groups on axis 0 (G={g}, group_offset={off}), got {rhs.shape[0]}")
        if fam == "ragged_n" and lhs.shape[0] != nl:
            raise ValueError(f"lhs: expected {nl} local groups on axis 0 (G={g}, group_offset={off}), got {lhs.shape[0]}")

    # ----------------------------------------------------------------- derived
    def _ragged_last(self, operand: str) -> bool:
        fam = self.family
        if operand == "lhs":
            return (fam == "ragged_m" and self.lhs_transposed) or (fam == "ragged_k" and not self.lhs_transposed)
        return (fam == "ragged_n" and not self.rhs_transposed) or (fam == "ragged_k" and self.rhs_transposed)

    @property
    def num_groups(self) -> int:
        return self._G

    @property
    def batch_shape(self) -> tuple[int, ...]:
        return self._batch_shape

    @property
    def m(self) -> int:
        return self._mkn[0]

    @property
    def k(self) -> int:
        return self._mkn[1]

    @property
    def n(self) -> int:
        return self._mkn[2]

    @property
    def ragged_extent(self) -> int | None:
        return {"ragged_m": self.m, "ragged_n": self.n, "ragged_k": self.k}.get(self.family)

    @property
    def out_shape(self) -> tuple[int, ...]:
        b, m, n = self.batch_shape, self.m, self.n
        if self.family in ("ragged_m", "ragged_n"):
            return (*b, m, n)
        return (self.num_local_groups, *b, m, n)

    def sizes_at(self, bi: tuple[int, ...]) -> np.ndarray:
        """The group sizes that apply at batch index ``bi``."""
        gs = self.group_sizes
        if gs is None:
            return np.ones(self.num_groups, np.int64)
        return gs if gs.ndim == 1 else gs[bi]

    def offsets_at(self, bi: tuple[int, ...]) -> np.ndarray:
        """Exclusive prefix sums of the sizes (length G + 1)."""
        s = self.sizes_at(bi)
        return np.concatenate([[0], np.cumsum(s)]).astype(np.int64)

    @property
    def local_groups(self) -> range:
        return range(self.group_offset, self.group_offset + self.num_local_groups)

    def replace(self, **changes: Any) -> Problem:
        """A copy with some fields changed (validated again)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if "group_sizes" not in changes and self.family == "batch":
            fields["group_sizes"] = None
        fields.update(changes)
        return Problem(**fields)

    # ------------------------------------------------------------ entry points
    def reference(self) -> Reference:
        """The exact result, its rounding, the defined-mask and (lazily) the bound."""
        from gmm_ref.reference import compute

        return compute(self)

    def arguments(self) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """``(args, kwargs)`` of this problem's convention's public kernel (NumPy arrays)."""
        from gmm_ref.conventions import arguments

        return arguments(self)

    def describe(self) -> str:
        """One line: family, layout, shapes, dtypes, sizes and policies."""
        parts = [self.family]
        if self.convention:
            parts.append(f"convention={self.convention}")
        lay = []
        if self.lhs_transposed:
            lay.append("lhs^T")
        if self.rhs_transposed:
            lay.append("rhs^T")
        if self.packed:
            lay.append("packed")
        if lay:
            parts.append("layout=" + ",".join(lay))
        parts.append(f"lhs{list(self.lhs.shape)}:{self.lhs.dtype}")
        parts.append(f"rhs{list(self.rhs.shape)}:{self.rhs.dtype}")
        parts.append(f"out{list(self.out_shape)}:{self.out_dtype}")
        if self.group_sizes is not None:
            parts.append(f"group_sizes={self.group_sizes.tolist()}")
        if self.num_local_groups != self.num_groups or self.group_offset:
            parts.append(f"group_offset={self.group_offset} num_local_groups={self.num_local_groups}")
        if self.existing_out is not None:
            parts.append(f"existing_out({self.existing_policy})")
        if self.tiling:
            parts.append(f"tiling={self.tiling}")
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"Problem({self.describe()})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """One line in Hypothesis' falsifying examples (the reproducer carries the data)."""
        printer.text(repr(self))
