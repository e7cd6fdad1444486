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

A *scaled* (quantized) operand holds codes (``float8_e4m3fn``, ``float8_e5m2``,
``float4_e2m1fn``, ``int8``, ``int4``) and, in ``lhs_scales`` / ``rhs_scales``,
one scale per block of its :class:`~gmm_ref.scaled.Quantization`
(``lhs_quant`` / ``rhs_quant``). Its value is ``scale * code``. The scales of
each local group are a ``Quantization.scale_shape(rows, K_g)`` block, in the
operand's ``[rows, K]`` orientation (rows: M for lhs, N for rhs), and the
blocks of the local groups lie one after the other, row-major, in one 1-D
array (blocks restart at every group boundary; docs/scaled.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from gmm_ref import dtypes as _dt
from gmm_ref.scaled import ELEMENT_DTYPES, Quantization

__all__ = ["FAMILIES", "STORAGES", "Problem", "as_tiling"]

FAMILIES = ("ragged_m", "ragged_n", "ragged_k", "batch")
TAIL_POLICIES = ("zero", "undefined")
EMPTY_POLICIES = ("zero", "untouched", "undefined")
EXISTING_POLICIES = ("overwrite", "accumulate")
#: how an operand argument is laid out in memory, where a convention's arguments carry strides:
#: its own contiguous buffer, a transposed view of one, a slice of a wider buffer, a chunk of a split
STORAGES = ("contiguous", "transposed", "slice", "chunk")

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


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # validation normalises fields of the frozen dataclass


def _frozen(arr: np.ndarray) -> np.ndarray:
    """A read-only copy: nothing the caller (or a kernel) does to its array changes the problem."""
    out = np.array(arr, copy=True)
    out.flags.writeable = False
    return out


_convention_names: Callable[[], Iterable[str]] = tuple


def known_conventions(names: Callable[[], Iterable[str]]) -> None:
    """Tell problems where the registered convention names come from (``gmm_ref.conventions``
    calls it on import: a problem sits below the conventions, so it is told rather than importing them)."""
    global _convention_names
    _convention_names = names


def _convention_name(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"convention: expected a convention name (str) or None, got {type(value).__name__}")
    names = tuple(_convention_names())
    if names and value not in names:
        raise ValueError(f"convention: expected one of {names} or None, got {value!r}")
    return value


def _output_dtype(lhs: np.dtype, rhs: np.dtype, out_dtype: Any, scaled: bool = False) -> np.dtype:
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


def _shard(g: int, group_offset: Any, num_local_groups: Any) -> tuple[int, int]:
    """Validated ``(group_offset, num_local_groups)`` of G groups."""
    off = _as_int("group_offset", group_offset)
    if not 0 <= off <= g:
        raise ValueError(f"group_offset: expected 0 <= group_offset <= G={g}, got {off}")
    nl = _as_int("num_local_groups", num_local_groups, allow_none=True)
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


@dataclass(frozen=True, eq=False)
class Problem:
    """A grouped GEMM: operands as stored, group sizes, layouts and policies.

    ``tail`` says what the rows (columns) past ``sum(sizes)`` of a ragged
    output hold; ``foreign`` the same for rows of groups outside the local
    shard; ``empty`` what an empty group's ``[M, N]`` block holds in
    ``ragged_k``. With ``existing_out``, every output element not computed
    keeps its value (``overwrite``) or the result is added to it
    (``accumulate``). ``storage`` says how the lhs and rhs arguments lie in
    memory where a convention's arguments carry strides (torch tensors): one of
    :data:`STORAGES` each; it changes no value.
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
    storage: tuple[str, str] = ("contiguous", "contiguous")
    lhs_quant: Quantization | None = None
    lhs_scales: np.ndarray | None = None
    rhs_quant: Quantization | None = None
    rhs_scales: np.ndarray | None = None

    # ---------------------------------------------------------------- validation
    def __post_init__(self) -> None:
        _choice("family", self.family, FAMILIES)
        _choice("tail", self.tail, TAIL_POLICIES)
        _choice("foreign", self.foreign, TAIL_POLICIES)
        _choice("empty", self.empty, EMPTY_POLICIES)
        _choice("existing_policy", self.existing_policy, EXISTING_POLICIES)
        self._check_operands()
        _set(self, "out_dtype", _output_dtype(self.lhs.dtype, self.rhs.dtype, self.out_dtype, self.scaled))
        self._check_shapes()
        if self.family == "batch":
            self._check_batch_groups()
        else:
            self._check_groups()
        self._check_existing()
        self._check_scales()
        if self.tiling is not None:
            _set(self, "tiling", as_tiling(self.tiling))
        self._check_storage()
        _set(self, "convention", _convention_name(self.convention))

    def _check_storage(self) -> None:
        st = self.storage
        if isinstance(st, str) or not isinstance(st, (tuple, list)) or len(st) != 2:
            raise TypeError(f"storage: expected a pair (lhs, rhs) of {STORAGES}, got {st!r}")
        for name, kind in zip(("lhs", "rhs"), st, strict=True):
            _choice(f"storage[{name}]", kind, STORAGES)
        _set(self, "storage", tuple(st))

    @property
    def scaled(self) -> bool:
        """Whether some operand is quantized (codes and scales)."""
        return self.lhs_quant is not None or self.rhs_quant is not None

    def _check_operands(self) -> None:
        for name in ("lhs", "rhs"):
            quant = getattr(self, f"{name}_quant")
            if quant is not None and not isinstance(quant, Quantization):
                raise TypeError(f"{name}_quant: expected a gmm_ref.Quantization or None, got {type(quant).__name__}")
            arr = getattr(self, name)
            if not isinstance(arr, np.ndarray):
                raise TypeError(f"{name}: expected a numpy.ndarray, got {type(arr).__name__}")
            if quant is not None:
                if arr.dtype != quant.elem:
                    raise TypeError(f"{name}: expected codes of dtype {quant.elem} ({name}_quant.elem), "
                                    f"got {arr.dtype}")
            elif arr.dtype not in _dt.INPUT_DTYPES:
                raise TypeError(
                    f"{name}: unsupported dtype {arr.dtype}; expected one of "
                    f"{[str(d) for d in _dt.INPUT_DTYPES]}"
                    + (f" (or codes of {[str(d) for d in ELEMENT_DTYPES]} with {name}_quant)"
                       if arr.dtype in ELEMENT_DTYPES else "")
                )
            _set(self, name, _frozen(arr))
        if not self.scaled and _dt.is_integer(self.lhs.dtype) != _dt.is_integer(self.rhs.dtype):
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
        _set(self, "batch_ndim", nb)

    def _check_shapes(self) -> None:
        fam, nb = self.family, self.batch_ndim
        lhs, rhs = self.lhs, self.rhs
        grouped_lhs = fam in ("ragged_n", "batch")
        grouped_rhs = fam in ("ragged_m", "batch")
        for name, arr, want in (("lhs", lhs, nb + 2 + grouped_lhs), ("rhs", rhs, nb + 2 + grouped_rhs)):
            if arr.ndim != want:
                raise ValueError(
                    f"{name}: expected {want} dims for family {fam!r} with batch_ndim={nb}, got shape {arr.shape}"
                )
        lb = lhs.shape[grouped_lhs:grouped_lhs + nb]
        rb = rhs.shape[grouped_rhs:grouped_rhs + nb]
        if lb != rb:
            raise ValueError(f"lhs/rhs: batch dims differ: {lb} vs {rb}")
        l2 = lhs.shape[-2:] if not self.lhs_transposed else lhs.shape[-2:][::-1]
        r2 = rhs.shape[-2:] if not self.rhs_transposed else rhs.shape[-2:][::-1]
        (m, k), (k2, n) = l2, r2
        if k != k2:
            raise ValueError(f"lhs/rhs: contracting extents differ: lhs has K={k}, rhs has K={k2}")
        if self.packed and not any(self.ragged_last(op) for op in ("lhs", "rhs")):
            raise ValueError("packed: True, but no operand of this problem is ragged along its last axis")
        _set(self, "_mkn", (m, k, n))
        _set(self, "_batch_shape", tuple(lb))

    def _check_batch_groups(self) -> None:
        if self.group_sizes is not None:
            raise ValueError("group_sizes: the batch family takes none (every group is one whole matrix); "
                             "expected None")
        g = self.lhs.shape[0]
        if self.rhs.shape[0] != g:
            raise ValueError(f"rhs: expected {g} groups on axis 0 (as lhs), got {self.rhs.shape[0]}")
        if self.group_offset != 0 or self.num_local_groups not in (None, g):
            raise ValueError("group_offset/num_local_groups: the batch family has no sharding")
        _set(self, "group_sizes", None)
        _set(self, "group_offset", 0)
        _set(self, "num_local_groups", g)
        _set(self, "_G", g)

    def _check_groups(self) -> None:
        fam = self.family
        gs = self.group_sizes
        if gs is None:
            raise ValueError(f"group_sizes: required for family {fam!r}")
        gs = np.asarray(gs)
        if gs.ndim == 0 or not (np.issubdtype(gs.dtype, np.integer)):
            raise TypeError(
                f"group_sizes: expected an integer array of shape [G] or [b..., G], got dtype {gs.dtype} "
                f"shape {gs.shape}"
            )
        if gs.ndim != 1 and gs.shape[:-1] != self._batch_shape:
            want = "[G]" if not self._batch_shape else f"[G] or {[*self._batch_shape, 'G']}"
            raise ValueError(f"group_sizes: expected shape {want}, got {gs.shape}")
        if np.any(gs < 0):
            raise ValueError(f"group_sizes: must be non-negative, got {gs.tolist()}")
        extent = self.ragged_extent
        axis = fam[-1].upper()
        if np.any(gs > extent):  # checked first: a sum of huge sizes could wrap around
            raise ValueError(f"group_sizes: size {int(np.max(gs))} exceeds the ragged extent {extent} ({axis})")
        totals = gs.astype(np.int64).sum(axis=-1)
        if np.any(totals > extent):
            raise ValueError(f"group_sizes: sum {int(np.max(totals))} exceeds the ragged extent {extent} ({axis})")
        g = gs.shape[-1]
        off, nl = _shard(g, self.group_offset, self.num_local_groups)
        _set(self, "group_offset", off)
        _set(self, "num_local_groups", nl)
        _set(self, "_G", g)
        gs = np.array(gs, dtype=np.int64)
        gs.setflags(write=False)
        _set(self, "group_sizes", gs)
        grouped = {"ragged_m": ("rhs", self.rhs), "ragged_n": ("lhs", self.lhs)}.get(fam)
        if grouped is not None and grouped[1].shape[0] != nl:
            raise ValueError(
                f"{grouped[0]}: expected {nl} local groups on axis 0 (G={g}, group_offset={off}), "
                f"got {grouped[1].shape[0]}"
            )

    def _check_scales(self) -> None:
        for name in ("lhs", "rhs"):
            quant, scales = getattr(self, f"{name}_quant"), getattr(self, f"{name}_scales")
            if quant is None:
                if scales is not None:
                    raise ValueError(f"{name}_scales: given without {name}_quant (the Quantization they belong to)")
                continue
            if self.batch_ndim:
                raise ValueError(f"{name}_quant: scaled problems take no batch dims (got batch_ndim="
                                 f"{self.batch_ndim})")
            if self.existing_out is not None:
                raise ValueError(f"{name}_quant: scaled problems take no existing_out")
            if scales is None:
                raise ValueError(f"{name}_scales: required with {name}_quant")
            shapes = self.scale_shapes(name, quant)
            if not isinstance(scales, np.ndarray):
                if not isinstance(scales, (list, tuple)):
                    raise TypeError(f"{name}_scales: expected a 1-D array, or one array per local group, "
                                    f"got {type(scales).__name__}")
                scales = self._join_scales(name, quant, scales, shapes)
            if scales.dtype != quant.scale:
                raise TypeError(f"{name}_scales: expected dtype {quant.scale} ({name}_quant.scale), got {scales.dtype}")
            starts = np.concatenate([[0], np.cumsum([r * c for r, c in shapes], dtype=np.int64)])
            want = int(starts[-1])
            _set(self, f"_{name}_scale_blocks", (tuple(shapes), starts))  # each group's block: shape, start
            if scales.ndim != 1 or scales.size != want:
                raise ValueError(f"{name}_scales: expected a 1-D array of {want} scales (the local groups' "
                                 f"{quant.block} blocks one after the other), got shape {scales.shape}")
            _set(self, f"{name}_scales", _frozen(scales))

    def _join_scales(self, name: str, quant: Quantization, per_group: Any, shapes: list[tuple[int, int]]
                     ) -> np.ndarray:
        if len(per_group) != self.num_local_groups:
            raise ValueError(f"{name}_scales: expected one array per local group ({self.num_local_groups}), "
                             f"got {len(per_group)}")
        parts = []
        for local, (block, shape) in enumerate(zip(per_group, shapes, strict=True)):
            block = np.asarray(block)
            if block.shape != shape:
                raise ValueError(f"{name}_scales[{local}]: expected shape {shape} ({quant.block} blocks of a "
                                 f"{list(self.scale_extent(name, local))} operand), got {block.shape}")
            parts.append(block.reshape(-1))
        return np.concatenate(parts) if parts else np.zeros(0, quant.scale)

    def scale_extent(self, operand: str, local: int) -> tuple[int, int]:
        """``(rows, K)`` of local group ``local``'s block of ``operand`` ("lhs" or "rhs"), in its ``[rows, K]``
        orientation (rows: M for lhs, N for rhs)."""
        fam = self.family
        size = 0
        if fam != "batch":
            off = self.offsets_at(())
            g = self.group_offset + local
            size = int(off[g + 1] - off[g])
        rows = self.m if operand == "lhs" else self.n
        k = self.k
        if (fam, operand) in (("ragged_m", "lhs"), ("ragged_n", "rhs")):
            rows = size
        elif fam == "ragged_k":
            k = size
        return rows, k

    def scale_shapes(self, operand: str, quant: Quantization) -> list[tuple[int, int]]:
        """The shape of each local group's block of ``operand``'s scales under ``quant`` (their sizes summed:
        how many scales the operand takes)."""
        return [quant.scale_shape(*self.scale_extent(operand, local)) for local in range(self.num_local_groups)]

    def scales_of(self, operand: str, local: int) -> np.ndarray:
        """Local group ``local``'s scales of ``operand`` as a 2-D ``scale_shape`` block (its ``[rows, K]``
        orientation); ValueError if that operand is not scaled."""
        quant, flat = getattr(self, f"{operand}_quant"), getattr(self, f"{operand}_scales")
        if quant is None:
            raise ValueError(f"operand: {operand} of this problem is not scaled")
        shapes, starts = getattr(self, f"_{operand}_scale_blocks")
        start = int(starts[local])
        return flat[start:int(starts[local + 1])].reshape(shapes[local])

    def _check_existing(self) -> None:
        ex = self.existing_out
        if ex is None:
            return
        if not isinstance(ex, np.ndarray):
            raise TypeError(f"existing_out: expected a numpy.ndarray, got {type(ex).__name__}")
        if ex.shape != self.out_shape or ex.dtype != self.out_dtype:
            raise ValueError(
                f"existing_out: expected shape {self.out_shape} and dtype {self.out_dtype}, "
                f"got shape {ex.shape} and dtype {ex.dtype}"
            )
        _set(self, "existing_out", _frozen(ex))

    # ----------------------------------------------------------------- derived
    def ragged_last(self, operand: str) -> bool:
        """Whether ``operand`` ("lhs" or "rhs") is ragged along its stored last (fast) axis."""
        fam = self.family
        if operand == "lhs":
            return (fam == "ragged_m" and self.lhs_transposed) or (fam == "ragged_k" and not self.lhs_transposed)
        return (fam == "ragged_n" and not self.rhs_transposed) or (fam == "ragged_k" and self.rhs_transposed)

    @property
    def value_dtypes(self) -> tuple[np.dtype, np.dtype]:
        """The dtypes of the operands' values: a scaled operand's values (scale * code) count as float64."""
        f64 = np.dtype(np.float64)
        return (f64 if self.lhs_quant is not None else self.lhs.dtype,
                f64 if self.rhs_quant is not None else self.rhs.dtype)

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
        """A copy with some fields changed (validated again; arrays are copied)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if "group_sizes" not in changes and self.family == "batch":
            fields["group_sizes"] = None
        fields.update(changes)
        return Problem(**fields)

    # --------------------------------------------------------------- printing
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
        for name in ("lhs", "rhs"):
            arr, quant = getattr(self, name), getattr(self, f"{name}_quant")
            scaled = "" if quant is None else f"*{quant.describe()}"
            parts.append(f"{name}{list(arr.shape)}:{arr.dtype}{scaled}")
        parts.append(f"out{list(self.out_shape)}:{self.out_dtype}")
        if self.group_sizes is not None:
            parts.append(f"group_sizes={self.group_sizes.tolist()}")
        if self.num_local_groups != self.num_groups or self.group_offset:
            parts.append(f"group_offset={self.group_offset} num_local_groups={self.num_local_groups}")
        if self.existing_out is not None:
            parts.append(f"existing_out({self.existing_policy})")
        if self.tiling:
            parts.append(f"tiling={self.tiling}")
        if self.storage != ("contiguous", "contiguous"):
            parts.append(f"storage={','.join(self.storage)}")
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"Problem({self.describe()})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """One line in Hypothesis' falsifying examples (the reproducer carries the data)."""
        printer.text(repr(self))
