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

Two serving layouts (no batch dims, no sharding; an existing output is kept where no group writes):

=====================  ==============  ==============  ==============
family                 lhs             rhs             out
=====================  ==============  ==============  ==============
``masked``             ``[G, M, K]``   ``[G, K, N]``   ``[G, M, N]``
``padded_contiguous``  ``[T, K]``      ``[G, K, N]``   ``[T, N]``
=====================  ==============  ==============  ==============

``masked``: group g is the first ``group_sizes[g]`` rows of its own ``[M, K]``
matrix (a valid row count per group, as DeepGEMM's masked layout and vLLM's
batched experts take it). ``padded_contiguous``: the groups lie one after the
other in ``[T, K]``, each starting at a multiple of ``alignment`` (group g
starts at the end of group g - 1 rounded up to it), as DeepGEMM's contiguous
layout and vLLM's block-aligned expert layout take them. Output rows of no
group (rows past a group's count, padding rows between groups, rows past the
last group) follow ``tail``.

An operand whose ragged axis is its last (fast) axis is stored either
*strided* (group g is a column slice of the whole matrix, ``packed=False``) or
*packed* (group g is its own contiguous row-major ``(rows, size_g)`` block,
one after the other, ``packed=True``).

A *scaled* (quantized) operand holds codes (``float8_e4m3fn``, ``float8_e5m2``,
``float4_e2m1fn``, ``int8``, ``int4``) and, in ``lhs_scales`` / ``rhs_scales``,
one scale per block of its :class:`~gmm_ref.scaled.model.Quantization`
(``lhs_quant`` / ``rhs_quant``). Its value is ``scale * code``. The scales of
each local group are a ``Quantization.scale_shape(rows, K_g)`` block, in the
operand's ``[rows, K]`` orientation (rows: M for lhs, N for rhs), and the
blocks of the local groups lie one after the other, row-major, in one 1-D
array (blocks restart at every group boundary; docs/scaled.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from gmm_ref import dtypes as _dt
from gmm_ref import families as _families
from gmm_ref.checks import (
    aligned_starts,
    as_int,
    as_tiling,
    choice,
    convention_name,
    frozen_copy,
    output_dtype,
    set_field,
    shard_of,
)
from gmm_ref.scaled.model import ELEMENT_DTYPES, Quantization

__all__ = ["FAMILIES", "RAGGED_FAMILIES", "SERVING_FAMILIES", "STORAGES", "Problem", "aligned_starts", "as_tiling"]

#: every family's name (the records: :mod:`gmm_ref.families`)
FAMILIES = _families.names()
#: the families of one ragged axis (and batch), each with every layout, batch dims and sharding
RAGGED_FAMILIES = _families.ragged_names()
#: the serving layouts: a valid row count per group's own matrix, or groups at aligned row offsets
SERVING_FAMILIES = _families.serving_names()
TAIL_POLICIES = ("zero", "undefined")
EMPTY_POLICIES = ("zero", "untouched", "undefined")
EXISTING_POLICIES = ("overwrite", "accumulate")
#: how an operand argument is laid out in memory, where a convention's arguments carry strides:
#: its own contiguous buffer, a transposed view of one, a slice of a wider buffer, a chunk of a split
STORAGES = ("contiguous", "transposed", "slice", "chunk")

#: a family's name (its record, the facts: gmm_ref.families.Family)
FamilyName = Literal["ragged_m", "ragged_n", "ragged_k", "batch", "masked", "padded_contiguous"]


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

    family: FamilyName
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
    #: ``padded_contiguous`` only: every group starts at a multiple of it
    alignment: int | None = None
    #: per local group, float32: the second scale level of an operand whose Quantization has ``global_scale``
    lhs_global: np.ndarray | None = None
    rhs_global: np.ndarray | None = None

    # ---------------------------------------------------------------- validation
    def __post_init__(self) -> None:
        set_field(self, "family", _families.get(self.family).name)  # a name (or its record) -> the name
        choice("tail", self.tail, TAIL_POLICIES)
        choice("foreign", self.foreign, TAIL_POLICIES)
        choice("empty", self.empty, EMPTY_POLICIES)
        choice("existing_policy", self.existing_policy, EXISTING_POLICIES)
        self._check_operands()
        set_field(self, "out_dtype", output_dtype(self.lhs.dtype, self.rhs.dtype, self.out_dtype, self.scaled))
        self._check_shapes()
        if not self.family_facts.takes_sizes:
            self._check_batch_groups()
        elif self.family_facts.serving:
            self._check_serving_groups()
        else:
            self._check_groups()
        self._check_existing()
        self._check_scales()
        if self.tiling is not None:
            set_field(self, "tiling", as_tiling(self.tiling))
        self._check_storage()
        set_field(self, "convention", convention_name(self.convention))

    def _check_storage(self) -> None:
        st = self.storage
        if isinstance(st, str) or not isinstance(st, (tuple, list)) or len(st) != 2:
            raise TypeError(f"storage: expected a pair (lhs, rhs) of {STORAGES}, got {st!r}")
        for name, kind in zip(("lhs", "rhs"), st, strict=True):
            choice(f"storage[{name}]", kind, STORAGES)
        set_field(self, "storage", tuple(st))

    @property
    def family_facts(self) -> _families.Family:
        """The record of :attr:`family` (its ragged axis, grouped operands, ...: :mod:`gmm_ref.families`)."""
        return _families.get(self.family)

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
            set_field(self, name, frozen_copy(arr))
        if not self.scaled and _dt.is_integer(self.lhs.dtype) != _dt.is_integer(self.rhs.dtype):
            raise TypeError(
                f"lhs/rhs: integer and floating inputs cannot be mixed "
                f"(got {self.lhs.dtype} and {self.rhs.dtype})"
            )
        for name in ("lhs_transposed", "rhs_transposed", "packed"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"{name}: expected a bool, got {getattr(self, name)!r}")
        nb = as_int("batch_ndim", self.batch_ndim)
        if nb < 0:
            raise ValueError(f"batch_ndim: expected >= 0, got {nb}")
        set_field(self, "batch_ndim", nb)

    def _check_shapes(self) -> None:
        fam, nb, facts = self.family, self.batch_ndim, self.family_facts
        lhs, rhs = self.lhs, self.rhs
        grouped_lhs = facts.is_grouped("lhs")
        grouped_rhs = facts.is_grouped("rhs")
        if nb and not facts.batch_dims:
            raise ValueError(f"batch_ndim: the {fam} family takes no batch dims, got {nb}")
        if self.lhs_transposed and not facts.lhs_transposable:
            raise ValueError(f"lhs_transposed: the {fam} family stores lhs [T, K] (its rows are the "
                             "groups' rows), expected False")
        if self.alignment is not None and facts.groups != _families.ALIGNED:
            raise ValueError(f"alignment: only the padded_contiguous family takes one, got {self.alignment!r} for "
                             f"family {fam!r}")
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
        set_field(self, "_mkn", (m, k, n))
        set_field(self, "_batch_shape", tuple(lb))

    def _check_batch_groups(self) -> None:
        if self.group_sizes is not None:
            raise ValueError("group_sizes: the batch family takes none (every group is one whole matrix); "
                             "expected None")
        g = self.lhs.shape[0]
        if self.rhs.shape[0] != g:
            raise ValueError(f"rhs: expected {g} groups on axis 0 (as lhs), got {self.rhs.shape[0]}")
        if self.group_offset != 0 or self.num_local_groups not in (None, g):
            raise ValueError("group_offset/num_local_groups: the batch family has no sharding")
        set_field(self, "group_sizes", None)
        set_field(self, "group_offset", 0)
        set_field(self, "num_local_groups", g)
        set_field(self, "_G", g)

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
        axis = self.family_facts.ragged.upper()
        if np.any(gs > extent):  # checked first: a sum of huge sizes could wrap around
            raise ValueError(f"group_sizes: size {int(np.max(gs))} exceeds the ragged extent {extent} ({axis})")
        totals = gs.astype(np.int64).sum(axis=-1)
        if np.any(totals > extent):
            raise ValueError(f"group_sizes: sum {int(np.max(totals))} exceeds the ragged extent {extent} ({axis})")
        g = gs.shape[-1]
        off, nl = shard_of(g, self.group_offset, self.num_local_groups)
        set_field(self, "group_offset", off)
        set_field(self, "num_local_groups", nl)
        set_field(self, "_G", g)
        gs = np.array(gs, dtype=np.int64)
        gs.setflags(write=False)
        set_field(self, "group_sizes", gs)
        grouped = next(((op, getattr(self, op)) for op in ("lhs", "rhs") if self.family_facts.is_grouped(op)), None)
        if grouped is not None and grouped[1].shape[0] != nl:
            raise ValueError(
                f"{grouped[0]}: expected {nl} local groups on axis 0 (G={g}, group_offset={off}), "
                f"got {grouped[1].shape[0]}"
            )

    def _check_serving_groups(self) -> None:
        fam = self.family
        gs = self.group_sizes
        if gs is None:
            raise ValueError(f"group_sizes: required for family {fam!r}")
        gs = np.asarray(gs)
        if gs.ndim != 1 or not np.issubdtype(gs.dtype, np.integer):
            raise TypeError(f"group_sizes: expected a 1-D integer array [G] for family {fam!r}, got dtype {gs.dtype} "
                            f"shape {gs.shape}")
        if np.any(gs < 0):
            raise ValueError(f"group_sizes: must be non-negative, got {gs.tolist()}")
        g = gs.size
        if self.group_offset != 0 or self.num_local_groups not in (None, g):
            raise ValueError(f"group_offset/num_local_groups: the {fam} family has no sharding (every group is "
                             "local)")
        if self.existing_out is not None and self.existing_policy != "overwrite":
            raise ValueError(f"existing_policy: the {fam} family's existing output is kept where no group writes "
                             f"('overwrite'), got {self.existing_policy!r}")
        rhs_groups = self.rhs.shape[0]
        if rhs_groups != g:
            raise ValueError(f"rhs: expected {g} groups on axis 0 (len(group_sizes)), got {rhs_groups}")
        gs = np.array(gs, dtype=np.int64)
        if self.family_facts.groups == _families.COUNTS:
            if self.lhs.shape[0] != g:
                raise ValueError(f"lhs: expected {g} groups on axis 0 (len(group_sizes)), got {self.lhs.shape[0]}")
            if np.any(gs > self.m):
                raise ValueError(f"group_sizes: a valid row count {int(gs.max())} exceeds the rows of a group's "
                                 f"matrix (M={self.m})")
        else:
            al = as_int("alignment", self.alignment, allow_none=True)
            if al is None or al < 1:
                raise ValueError(f"alignment: the padded_contiguous family needs a positive int (each group starts at "
                                 f"a multiple of it), got {self.alignment!r}")
            set_field(self, "alignment", al)
            if np.any(gs > self.m):  # checked first: a sum of huge sizes could wrap around
                raise ValueError(f"group_sizes: size {int(np.max(gs))} exceeds the ragged extent {self.m} (M)")
            ends = aligned_starts(gs, al) + gs
            end = int(np.max(ends[gs > 0], initial=0))  # an empty group past the last row holds none
            if end > self.m:
                raise ValueError(f"group_sizes: the groups, each starting at a multiple of alignment={al}, end at row "
                                 f"{end}, past the ragged extent {self.m} (M)")
        set_field(self, "group_offset", 0)
        set_field(self, "num_local_groups", g)
        set_field(self, "_G", g)
        gs.setflags(write=False)
        set_field(self, "group_sizes", gs)

    def _check_scales(self) -> None:
        for name in ("lhs", "rhs"):
            quant, scales = getattr(self, f"{name}_quant"), getattr(self, f"{name}_scales")
            if quant is None:
                if scales is not None:
                    raise ValueError(f"{name}_scales: given without {name}_quant (the Quantization they belong to)")
                if getattr(self, f"{name}_global") is not None:
                    raise ValueError(f"{name}_global: given without {name}_quant (a Quantization with "
                                     "global_scale=True)")
                continue
            if self.batch_ndim:
                raise ValueError(f"{name}_quant: scaled problems take no batch dims (got batch_ndim="
                                 f"{self.batch_ndim})")
            if self.existing_out is not None and self.existing_policy != "overwrite":
                raise ValueError(f"{name}_quant: a scaled problem's existing_out is only kept where no group writes "
                                 f"(existing_policy='overwrite'), not accumulated into")
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
            set_field(self, f"_{name}_scale_blocks", (tuple(shapes), starts))  # each group's block: shape, start
            if scales.ndim != 1 or scales.size != want:
                raise ValueError(f"{name}_scales: expected a 1-D array of {want} scales (the local groups' "
                                 f"{quant.block} blocks one after the other), got shape {scales.shape}")
            set_field(self, f"{name}_scales", frozen_copy(scales))
            self._check_global(name, quant)

    def _check_global(self, name: str, quant: Quantization) -> None:
        value = getattr(self, f"{name}_global")
        if not quant.global_scale:
            if value is not None:
                raise ValueError(f"{name}_global: given, but {name}_quant has no second level (global_scale=False)")
            return
        if value is None:
            raise ValueError(f"{name}_global: required with {name}_quant.global_scale (one float32 per local group)")
        arr = np.asarray(value) if isinstance(value, (list, tuple)) else value
        if not isinstance(arr, np.ndarray) or arr.dtype != np.float32 or arr.shape != (self.num_local_groups,):
            raise TypeError(f"{name}_global: expected a float32 array of shape ({self.num_local_groups},) (one per "
                            f"local group), got {getattr(arr, 'dtype', type(arr).__name__)} "
                            f"{getattr(arr, 'shape', '')}")
        set_field(self, f"{name}_global", frozen_copy(arr))

    def global_of(self, operand: str, local: int) -> float:
        """Local group ``local``'s second-level scale of ``operand`` (1.0 where it has none)."""
        value = getattr(self, f"{operand}_global")
        return 1.0 if value is None else float(value[local])

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
        facts = self.family_facts
        size = 0
        if facts.takes_sizes:  # masked: spans [0, count) of each group's own matrix
            starts, ends = self.spans_at(())
            g = self.group_offset + local
            size = int(ends[g] - starts[g])
        rows = self.m if operand == "lhs" else self.n
        k = self.k
        if facts.ragged == ("m" if operand == "lhs" else "n"):  # the operand's rows
            rows = size
        elif facts.ragged_contraction:
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
        set_field(self, "existing_out", frozen_copy(ex))

    # ----------------------------------------------------------------- derived
    def ragged_last(self, operand: str) -> bool:
        """Whether ``operand`` ("lhs" or "rhs") is ragged along its stored last (fast) axis."""
        transposed = self.lhs_transposed if operand == "lhs" else self.rhs_transposed
        return self.family_facts.ragged_last(operand, transposed)

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
        """The extent the group sizes live in: the ragged axis (``masked``: the rows of one group's matrix)."""
        return self.family_facts.extent(self.m, self.k, self.n)

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.family_facts.shape("out", self.m, self.k, self.n, self.num_local_groups, self.batch_shape)

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

    def spans_at(self, bi: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, ends)`` of every group along its ragged axis (G each): contiguous groups for the ragged
        families, aligned starts for ``padded_contiguous``, ``[0, size)`` of each group's own matrix for
        ``masked``; ``[0, 1)`` for the batch family."""
        groups = self.family_facts.groups
        if groups == _families.COUNTS:
            return np.zeros(self.num_groups, np.int64), self.group_sizes.astype(np.int64)
        if groups == _families.ALIGNED:
            starts = aligned_starts(self.group_sizes, self.alignment)
            return starts, starts + self.group_sizes
        off = self.offsets_at(bi)
        return off[:-1], off[1:]

    @property
    def local_groups(self) -> range:
        return range(self.group_offset, self.group_offset + self.num_local_groups)

    def replace(self, **changes: Any) -> Problem:
        """A copy with some fields changed (validated again; arrays are copied)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if "group_sizes" not in changes and not self.family_facts.takes_sizes:
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
        if self.alignment is not None:
            parts.append(f"alignment={self.alignment}")
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
