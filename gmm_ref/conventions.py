"""Convention front-ends: the real kernels' calling conventions over the reference.

Each front-end takes the arguments of a public kernel (as NumPy arrays),
builds the :class:`~gmm_ref.Problem` that the kernel's semantics describe, and
returns the reference values in the output dtype. ``with_reference=True``
returns the :class:`~gmm_ref.Reference` instead (values, defined-mask, bound).
:func:`arguments` is the inverse: a problem back to a kernel's arguments.

Where the real kernel leaves elements undefined, the problem says so and the
mask excludes them (the value returned there is 0 or ``existing_out``):

- ``ragged_dot`` / ``ragged_dot_general``: nothing undefined (XLA CPU zeroes
  rows past ``sum(group_sizes)``; mode 3 ignores ``group_sizes``).
- ``gmm`` (megablox): rows past ``sum(group_sizes)`` are never written;
  rows of groups outside the shard are zeroed when there is no ``existing_out``.
- ``tgmm`` (megablox): with ``group_offset`` but no ``num_actual_groups``,
  the trailing ``group_offset`` output slots are never written.
- ``grouped_mm`` (torch): rows/columns past ``offs[-1]`` (CUDA never writes them).
- ``te_grouped_gemm``: nothing (TE requires sums equal to the extents on Hopper).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from gmm_ref import dtypes as _dt
from gmm_ref.problem import Problem
from gmm_ref.reference import Reference

__all__ = [
    "CONVENTIONS",
    "RaggedDotDimensionNumbers",
    "arguments",
    "gmm",
    "grouped_mm",
    "problem_from_arguments",
    "ragged_dot",
    "ragged_dot_general",
    "te_grouped_gemm",
    "tgmm",
]

CONVENTIONS = (
    "ragged_dot",
    "ragged_dot_general",
    "megablox.gmm",
    "megablox.tgmm",
    "torch.grouped_mm",
    "te.grouped_gemm",
)


class RaggedDotDimensionNumbers(NamedTuple):
    """jax-free twin of ``jax.lax.RaggedDotDimensionNumbers`` (same fields)."""

    dot_dimension_numbers: tuple[tuple[Sequence[int], Sequence[int]], tuple[Sequence[int], Sequence[int]]]
    lhs_ragged_dimensions: Sequence[int]
    rhs_group_dimensions: Sequence[int]


def _arr(name: str, x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    mod = type(x).__module__
    if mod.startswith(("jax", "jaxlib", "torch")):
        from gmm_ref.compare import as_numpy

        return as_numpy(x)
    if isinstance(x, (list, tuple)):
        return np.asarray(x)
    raise TypeError(f"{name}: expected an array, got {type(x).__name__}")


def _sizes(name: str, x: Any, *, ndim1: bool = True) -> np.ndarray:
    gs = _arr(name, x)
    if not np.issubdtype(gs.dtype, np.integer):
        raise TypeError(f"{name}: expected an integer array, got dtype {gs.dtype}")
    if ndim1 and gs.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array of G sizes, got shape {gs.shape}")
    return gs


def _ndim(name: str, x: np.ndarray, want: int | tuple[int, ...]) -> None:
    want_t = (want,) if isinstance(want, int) else want
    if x.ndim not in want_t:
        raise ValueError(f"{name}: expected {' or '.join(map(str, want_t))} dims, got shape {x.shape}")


def _finish(p: Problem, with_reference: bool) -> np.ndarray | Reference:
    ref = p.reference()
    return ref if with_reference else ref.values


def _out_dtype(name: str, value: Any) -> np.dtype | None:
    return None if value is None else _dt.as_dtype(value, name=name)


# ------------------------------------------------------------------ ragged_dot
def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None, *,
               with_reference: bool = False):
    """``jax.lax.ragged_dot``: ``lhs [M, K]``, ``rhs [G, K, N]``, sizes ``[G]`` -> ``[M, N]``."""
    lhs, rhs = _arr("lhs", lhs), _arr("rhs", rhs)
    _ndim("lhs", lhs, 2)
    _ndim("rhs", rhs, 3)
    gs = _sizes("group_sizes", group_sizes)
    if rhs.shape[0] != gs.shape[0]:
        raise ValueError(f"rhs: expected {gs.shape[0]} groups on axis 0 (len(group_sizes)), got {rhs.shape[0]}")
    p = Problem("ragged_m", lhs, rhs, gs, out_dtype=_out_dtype("preferred_element_type", preferred_element_type),
                convention="ragged_dot")
    return _finish(p, with_reference)


def _dn_fields(dn: Any) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
    try:
        ((lc, rc), (lb, rb)) = dn.dot_dimension_numbers
        lr = list(dn.lhs_ragged_dimensions)
        rg = list(dn.rhs_group_dimensions)
    except (AttributeError, TypeError, ValueError):
        raise TypeError(
            "ragged_dot_dimension_numbers: expected a RaggedDotDimensionNumbers "
            f"(jax's or gmm_ref's), got {dn!r}"
        ) from None
    return list(lc), list(rc), list(lb), list(rb), lr, rg


def ragged_dot_general(lhs, rhs, group_sizes, ragged_dot_dimension_numbers, precision=None,
                       preferred_element_type=None, *, with_reference: bool = False):
    """``jax.lax.ragged_dot_general``, all three modes, with batch dims.

    gmm_ref supports one contracting dim and one non-contracting dim per
    operand (besides batch dims and the rhs group dim), at any positions.
    Mode 1 (ragged non-contracting): ``[b, m, k] x [g, b, k, n] -> [b, m, n]``;
    mode 2 (ragged contracting): ``[b, m, k] x [b, k, n] -> [g, b, m, n]``;
    mode 3 (ragged batch): a plain batched product, ``group_sizes`` ignored.
    """
    lhs, rhs = _arr("lhs", lhs), _arr("rhs", rhs)
    lc, rc, lb, rb, lr, rg = _dn_fields(ragged_dot_dimension_numbers)
    gs = _sizes("group_sizes", group_sizes, ndim1=False)
    name = "ragged_dot_dimension_numbers"
    if len(lr) != 1:
        raise ValueError(f"{name}: expected exactly one lhs ragged dimension, got {lr}")
    if len(lc) != 1 or len(rc) != 1:
        raise ValueError(f"{name}: gmm_ref supports exactly one contracting dim per operand, got {lc} and {rc}")
    if len(lb) != len(rb):
        raise ValueError(f"{name}: lhs and rhs batch dims differ in number: {lb} vs {rb}")
    for nm, dims, arr in (("lhs", lc + lb, lhs), ("rhs", rc + rb + rg, rhs)):
        if len(set(dims)) != len(dims) or any(not 0 <= d < arr.ndim for d in dims):
            raise ValueError(f"{name}: {nm} dims {dims} must be distinct axes of {nm} (ndim {arr.ndim})")
    l_free = [d for d in range(lhs.ndim) if d not in lc + lb]
    r_free = [d for d in range(rhs.ndim) if d not in rc + rb + rg]
    if len(l_free) != 1 or len(r_free) != 1:
        raise ValueError(
            f"{name}: gmm_ref supports exactly one non-contracting dim per operand, got lhs {l_free} "
            f"and rhs {r_free} (besides batch and group dims)"
        )
    ragged = lr[0]
    if not isinstance(ragged, (int, np.integer)) or not 0 <= ragged < lhs.ndim:
        raise ValueError(f"{name}: lhs ragged dim {ragged} is not an axis of lhs (ndim {lhs.ndim})")
    nb = len(lb)
    out_dt = _out_dtype("preferred_element_type", preferred_element_type)
    if ragged in l_free:  # mode 1
        if len(rg) != 1:
            raise ValueError(f"{name}: mode 1 (ragged non-contracting) needs exactly one rhs group dim, got {rg}")
        L = lhs.transpose(lb + l_free + lc)
        R = rhs.transpose(rg + rb + rc + r_free)
        if gs.ndim != 1 and gs.shape[:-1] != L.shape[:nb]:
            raise ValueError(f"group_sizes: expected shape [G] or {list(L.shape[:nb]) + ['G']}, got {gs.shape}")
        if R.shape[0] != gs.shape[-1]:
            raise ValueError(f"rhs: expected {gs.shape[-1]} groups on the group dim {rg[0]}, got {R.shape[0]}")
        p = Problem("ragged_m", L, R, gs, batch_ndim=nb, out_dtype=out_dt, convention="ragged_dot_general")
        return _finish(p, with_reference)
    if rg:
        raise ValueError(f"{name}: rhs group dims must be empty when the lhs ragged dim is contracting or batch, got {rg}")
    if ragged in lc:  # mode 2
        L = lhs.transpose(lb + l_free + lc)
        R = rhs.transpose(rb + rc + r_free)
        if gs.ndim != 1 and gs.shape[:-1] != L.shape[:nb]:
            raise ValueError(f"group_sizes: expected shape [G] or {list(L.shape[:nb]) + ['G']}, got {gs.shape}")
        p = Problem("ragged_k", L, R, gs, batch_ndim=nb, out_dtype=out_dt, convention="ragged_dot_general")
        return _finish(p, with_reference)
    # mode 3: ragged batch dim; the group axis is lhs_batch[0], sizes are ignored
    if ragged not in lb:
        raise ValueError(f"{name}: lhs ragged dim {ragged} is not an axis of lhs (ndim {lhs.ndim})")
    L = lhs.transpose(lb + l_free + lc)
    R = rhs.transpose(rb + rc + r_free)
    p = Problem("batch", L, R, None, batch_ndim=nb - 1, out_dtype=out_dt, convention="ragged_dot_general")
    return _finish(p, with_reference)


# --------------------------------------------------------------------- megablox
def _group_offset(value: Any) -> int:
    if value is None:
        return 0
    arr = _arr("group_offset", value) if not isinstance(value, (int, np.integer)) else np.asarray(value)
    if not np.issubdtype(arr.dtype, np.integer) or arr.size != 1:
        raise TypeError(f"group_offset: expected an integer scalar or shape-(1,) integer array, got {value!r}")
    return int(arr.reshape(()))


def _existing(value: Any) -> np.ndarray | None:
    return None if value is None else _arr("existing_out", value)


def gmm(lhs, rhs, group_sizes, preferred_element_type=np.float32, tiling=None, group_offset=None,
        existing_out=None, transpose_rhs=False, *, with_reference: bool = False):
    """megablox ``gmm``: ``lhs [M, K]``, ``rhs [num_local_groups, K, N]`` (``[.., N, K]`` transposed).

    Rows past ``sum(group_sizes)`` are undefined unless ``existing_out`` is
    given (then every row not computed keeps it); rows of groups outside
    ``[group_offset, group_offset + rhs.shape[0])`` are zero without it.
    """
    lhs, rhs = _arr("lhs", lhs), _arr("rhs", rhs)
    _ndim("lhs", lhs, 2)
    _ndim("rhs", rhs, 3)
    gs = _sizes("group_sizes", group_sizes)
    tiling = tuple(tiling) if tiling is not None and not callable(tiling) else None
    p = Problem(
        "ragged_m", lhs, rhs, gs, rhs_transposed=bool(transpose_rhs),
        out_dtype=_out_dtype("preferred_element_type", preferred_element_type),
        tail="undefined", foreign="zero", existing_out=_existing(existing_out), existing_policy="overwrite",
        group_offset=_group_offset(group_offset), num_local_groups=rhs.shape[0],
        convention="megablox.gmm", tiling=tiling,
    )
    return _finish(p, with_reference)


def tgmm(lhs, rhs, group_sizes, preferred_element_type=np.float32, tiling=None, group_offset=None,
         num_actual_groups=None, existing_out=None, *, with_reference: bool = False):
    """megablox ``tgmm``: ``lhs [M, sum K]`` (megablox's ``[k, m]``), ``rhs [sum K, N]`` -> ``[groups, M, N]``.

    Output slot ``i`` holds group ``group_offset + i``; empty groups give
    zeros; ``existing_out`` is accumulated into. Without ``num_actual_groups``
    the output has G slots of which the last ``group_offset`` are undefined.
    """
    lhs, rhs = _arr("lhs", lhs), _arr("rhs", rhs)
    _ndim("lhs", lhs, 2)
    _ndim("rhs", rhs, 2)
    gs = _sizes("group_sizes", group_sizes)
    g = gs.shape[0]
    off = _group_offset(group_offset)
    nag = num_actual_groups
    if nag is not None and (not isinstance(nag, (int, np.integer)) or isinstance(nag, bool)
                            or not 0 <= nag <= g - off):
        raise ValueError(f"num_actual_groups: expected an int in [0, G - group_offset = {g - off}], got {nag!r}")
    local = int(nag) if nag is not None else g - off
    slots = local if nag is not None else g
    tiling = tuple(tiling) if tiling is not None and not callable(tiling) else None
    ex = _existing(existing_out)
    out_dt = _out_dtype("preferred_element_type", preferred_element_type)
    if ex is not None and ex.shape[0] != slots:
        raise ValueError(f"existing_out: expected shape {(slots, lhs.shape[0], rhs.shape[1])}, got {ex.shape}")
    p = Problem(
        "ragged_k", lhs, rhs, gs, out_dtype=out_dt, empty="zero",
        existing_out=None if ex is None else ex[:local], existing_policy="accumulate",
        group_offset=off, num_local_groups=local, convention="megablox.tgmm", tiling=tiling,
    )
    ref = p.reference()
    if slots != local:  # trailing slots the kernel never writes
        pad = slots - local
        exact = np.concatenate([ref.exact, np.zeros((pad, *ref.exact.shape[1:]), ref.exact.dtype)])
        mask = np.concatenate([ref.mask, np.zeros((pad, *ref.mask.shape[1:]), bool)])
        if ex is not None:
            exact[local:] = ex[local:].astype(exact.dtype)
        ref = _PaddedReference(p, exact, mask, ref)
    return ref if with_reference else ref.values


class _PaddedReference(Reference):
    """A reference with extra, undefined output slots appended on axis 0."""

    def __init__(self, problem: Problem, exact: np.ndarray, mask: np.ndarray, inner: Reference):
        super().__init__(problem, exact, mask)
        self._inner = inner

    def bound(self, numerics=None) -> np.ndarray:
        b = self._inner.bound(numerics)
        return np.concatenate([b, np.zeros((self.exact.shape[0] - b.shape[0], *b.shape[1:]))])


# ------------------------------------------------------------------------ torch
def grouped_mm(mat_a, mat_b, offs=None, bias=None, out_dtype=None, *, with_reference: bool = False):
    """``torch._grouped_mm`` in its four forms.

    2d x 3d: ``[sum M, K] x [G, K, N] -> [sum M, N]``; 3d x 2d:
    ``[G, M, K] x [K, sum N] -> [M, sum N]``; 2d x 2d: ``[M, sum K] x [sum K, N]
    -> [G, M, N]``; 3d x 3d: batched, no ``offs``. ``offs`` are int32
    cumulative group ends; elements past ``offs[-1]`` are undefined.
    """
    a, b = _arr("mat_a", mat_a), _arr("mat_b", mat_b)
    _ndim("mat_a", a, (2, 3))
    _ndim("mat_b", b, (2, 3))
    if bias is not None:
        raise ValueError("bias: torch._grouped_mm does not support bias; expected None")
    out_dt = _out_dtype("out_dtype", out_dtype)
    if a.ndim == 3 and b.ndim == 3:
        if offs is not None:
            raise ValueError("offs: must be None for 3d x 3d (batched) grouped_mm")
        if a.shape[0] != b.shape[0]:
            raise ValueError(f"mat_b: expected {a.shape[0]} groups on axis 0 (as mat_a), got {b.shape[0]}")
        p = Problem("batch", a, b, None, out_dtype=out_dt, convention="torch.grouped_mm")
        return _finish(p, with_reference)
    if offs is None:
        raise ValueError(f"offs: required when mat_a or mat_b is 2-D (got {a.ndim}d x {b.ndim}d)")
    o = _sizes("offs", offs)
    if o.size and np.any(np.diff(o) < 0):
        raise ValueError(f"offs: expected non-decreasing cumulative group ends, got {o.tolist()}")
    if o.size and o[0] < 0:
        raise ValueError(f"offs: expected non-negative cumulative group ends, got {o.tolist()}")
    sizes = np.diff(np.concatenate([[0], o])).astype(np.int64)
    if a.ndim == 2 and b.ndim == 3:
        fam = "ragged_m"
        if b.shape[0] != sizes.size:
            raise ValueError(f"mat_b: expected {sizes.size} groups on axis 0 (len(offs)), got {b.shape[0]}")
    elif a.ndim == 3 and b.ndim == 2:
        fam = "ragged_n"
        if a.shape[0] != sizes.size:
            raise ValueError(f"mat_a: expected {sizes.size} groups on axis 0 (len(offs)), got {a.shape[0]}")
    else:
        fam = "ragged_k"
    p = Problem(fam, a, b, sizes, out_dtype=out_dt, tail="undefined", empty="zero",
                convention="torch.grouped_mm")
    return _finish(p, with_reference)


# --------------------------------------------------------------- TransformerEngine
def te_grouped_gemm(lhs, rhs, *, lhs_first_dims=None, lhs_last_dims=None, rhs_first_dims=None,
                    rhs_last_dims=None, contracting_dims=((1,), (0,)), preferred_element_type=None,
                    with_reference: bool = False):
    """TransformerEngine-style grouped GEMM described by per-axis group sizes.

    Each ``*_dims`` is a ``(G,)`` int array or None (that axis not ragged);
    at most one axis of each operand is ragged. A ragged last axis is stored
    packed (group g is a contiguous ``(rows, size_g)`` block), as TE's
    GroupedTensor does. A 3-D operand carries the group axis first.
    ``contracting_dims`` names the 2-D contracting axis of each operand.
    Output ragged dims are derived: ragged M -> ``[sum M, N]``, ragged N ->
    ``[M, sum N]``, ragged K -> ``[G, M, N]``.
    """
    lhs, rhs = _arr("lhs", lhs), _arr("rhs", rhs)
    _ndim("lhs", lhs, (2, 3))
    _ndim("rhs", rhs, (2, 3))
    dims = {}
    for nm, v in (("lhs_first_dims", lhs_first_dims), ("lhs_last_dims", lhs_last_dims),
                  ("rhs_first_dims", rhs_first_dims), ("rhs_last_dims", rhs_last_dims)):
        if v is not None and _arr(nm, v).size:
            dims[nm] = _sizes(nm, v)
    for op in ("lhs", "rhs"):
        if f"{op}_first_dims" in dims and f"{op}_last_dims" in dims:
            raise ValueError(f"{op}_first_dims/{op}_last_dims: an operand may be ragged on one axis only")
    try:
        (lcd,), (rcd,) = contracting_dims
    except (TypeError, ValueError):
        raise ValueError(f"contracting_dims: expected ((l,), (r,)), got {contracting_dims!r}") from None
    if lcd not in (0, 1) or rcd not in (0, 1):
        raise ValueError(f"contracting_dims: expected axes 0 or 1 of the 2-D matrices, got {contracting_dims!r}")
    lhs_t = lcd == 0  # lhs stored [K, M]
    rhs_t = rcd == 1  # rhs stored [N, K]
    lr = "first" if "lhs_first_dims" in dims else "last" if "lhs_last_dims" in dims else None
    rr = "first" if "rhs_first_dims" in dims else "last" if "rhs_last_dims" in dims else None
    sizes = [v for v in dims.values()]
    if not sizes:
        raise ValueError("lhs_first_dims/lhs_last_dims/rhs_first_dims/rhs_last_dims: at least one must be given")
    gs = sizes[0]
    for other in sizes[1:]:
        if other.shape != gs.shape or np.any(other != gs):
            raise ValueError("*_dims: every ragged axis must carry the same group sizes")

    def lhs_ragged_logical() -> str | None:  # "M" or "K"
        if lr is None:
            return None
        axis0 = "K" if lhs_t else "M"
        axis1 = "M" if lhs_t else "K"
        return axis0 if lr == "first" else axis1

    def rhs_ragged_logical() -> str | None:  # "K" or "N"
        if rr is None:
            return None
        axis0 = "N" if rhs_t else "K"
        axis1 = "K" if rhs_t else "N"
        return axis0 if rr == "first" else axis1

    lm, rm = lhs_ragged_logical(), rhs_ragged_logical()
    if lm == "M" and rm is None:
        fam = "ragged_m"
    elif lm is None and rm == "N":
        fam = "ragged_n"
    elif lm == "K" and rm == "K":
        fam = "ragged_k"
    else:
        raise ValueError(
            f"lhs_*_dims/rhs_*_dims: unsupported combination (lhs ragged on {lm}, rhs ragged on {rm}); "
            "expected ragged M (lhs only), ragged N (rhs only) or ragged K (both, on K)"
        )
    packed = lr == "last" or rr == "last"
    if lr == "last" and rr == "first" or lr == "first" and rr == "last":
        packed = True  # a packed last-axis operand beside a first-axis one is fine
    p = Problem(fam, lhs, rhs, gs, lhs_transposed=lhs_t, rhs_transposed=rhs_t, packed=packed,
                out_dtype=_out_dtype("preferred_element_type", preferred_element_type),
                tail="zero", empty="zero", convention="te.grouped_gemm")
    return _finish(p, with_reference)


# ------------------------------------------------------------- problem -> args
def arguments(p: Problem) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional and keyword arguments of ``p.convention``'s public kernel."""
    conv = p.convention
    if conv is None:
        raise ValueError("convention: this problem names no convention; set Problem(convention=...)")
    reason = expressible(p, conv)
    if reason:
        raise ValueError(f"convention: {conv!r} cannot express this problem: {reason}")
    gs32 = None if p.group_sizes is None else p.group_sizes.astype(np.int32)
    ped = p.out_dtype
    if conv == "ragged_dot":
        return (p.lhs, p.rhs, gs32), {"preferred_element_type": ped}
    if conv == "ragged_dot_general":
        return (p.lhs, p.rhs, gs32 if gs32 is not None else np.ones(p.num_groups, np.int32),
                _dimension_numbers(p)), {"preferred_element_type": ped}
    if conv == "megablox.gmm":
        return (p.lhs, p.rhs, gs32), {
            "preferred_element_type": ped,
            "tiling": p.tiling or (128, 128, 128),
            "group_offset": None if p.group_offset == 0 else np.array(p.group_offset, np.int32),
            "existing_out": p.existing_out,
            "transpose_rhs": p.rhs_transposed,
        }
    if conv == "megablox.tgmm":
        return (p.lhs, p.rhs, gs32), {
            "preferred_element_type": ped,
            "tiling": p.tiling or (128, 128, 128),
            "group_offset": None if p.group_offset == 0 else np.array(p.group_offset, np.int32),
            "num_actual_groups": p.num_local_groups,
            "existing_out": p.existing_out,
        }
    if conv == "torch.grouped_mm":
        offs = None if gs32 is None else np.cumsum(gs32).astype(np.int32)
        return (p.lhs, p.rhs), {"offs": offs, "out_dtype": ped}
    # te.grouped_gemm
    kw: dict[str, Any] = {}
    fam = p.family
    if fam == "ragged_m":
        kw["lhs_last_dims" if p.lhs_transposed else "lhs_first_dims"] = gs32
    elif fam == "ragged_n":
        kw["rhs_first_dims" if p.rhs_transposed else "rhs_last_dims"] = gs32
    else:
        kw["lhs_first_dims" if p.lhs_transposed else "lhs_last_dims"] = gs32
        kw["rhs_last_dims" if p.rhs_transposed else "rhs_first_dims"] = gs32
    kw["contracting_dims"] = ((0 if p.lhs_transposed else 1,), (1 if p.rhs_transposed else 0,))
    kw["preferred_element_type"] = ped
    return (p.lhs, p.rhs), kw


def expressible(p: Problem, conv: str) -> str | None:
    """None if ``conv`` can express ``p`` (and its policies), else the reason."""
    if conv not in CONVENTIONS:
        return f"unknown convention {conv!r}; expected one of {CONVENTIONS}"
    fam, nb = p.family, p.batch_ndim
    sharded = p.group_offset != 0 or p.num_local_groups != p.num_groups
    if conv in ("ragged_dot", "ragged_dot_general", "torch.grouped_mm", "te.grouped_gemm"):
        if sharded:
            return f"{conv} has no group_offset / sharded groups"
        if p.existing_out is not None:
            return f"{conv} takes no existing output"
    if conv == "ragged_dot":
        if fam != "ragged_m" or nb or p.lhs_transposed or p.rhs_transposed:
            return "ragged_dot takes only ragged M, lhs [M, K], rhs [G, K, N], no batch dims"
    elif conv == "ragged_dot_general":
        if fam == "ragged_n":
            return "ragged_dot_general has no ragged N mode"
        if p.packed:
            return "ragged_dot_general has no packed layout"
        if fam == "batch" and p.batch_ndim < 0:
            return "batch"
    elif conv == "megablox.gmm":
        if fam != "ragged_m" or nb or p.lhs_transposed:
            return "megablox gmm takes ragged M only, lhs [M, K], no batch dims"
        if p.existing_out is not None and p.existing_policy != "overwrite":
            return "megablox gmm overwrites existing_out"
        if p.existing_out is None and p.tail == "zero" and _has_tail(p):
            return "megablox gmm never writes rows past sum(group_sizes) (needs tail='undefined')"
    elif conv == "megablox.tgmm":
        if fam != "ragged_k" or nb or p.lhs_transposed or p.rhs_transposed or p.packed:
            return "megablox tgmm takes ragged K only, lhs [M, sum K] strided, rhs [sum K, N], no batch dims"
        if p.existing_out is not None and p.existing_policy != "accumulate":
            return "megablox tgmm accumulates into existing_out"
        if p.empty != "zero":
            return "megablox tgmm zeroes empty groups"
    elif conv == "torch.grouped_mm":
        if nb or p.lhs_transposed or p.rhs_transposed or p.packed:
            return "torch._grouped_mm takes row-major strided operands, no batch dims"
        if fam in ("ragged_m", "ragged_n") and p.tail == "zero" and _has_tail(p):
            return "torch._grouped_mm never writes rows/columns past offs[-1] (needs tail='undefined')"
    elif conv == "te.grouped_gemm":
        if nb:
            return "te.grouped_gemm takes no batch dims"
        if fam == "batch":
            return "te.grouped_gemm needs a ragged axis"
        if fam == "ragged_n":
            return "te.grouped_gemm cannot express ragged N (DESIGN.md section 5)"
        ragged_last = p._ragged_last("lhs") or p._ragged_last("rhs")
        if ragged_last and not p.packed:
            return "te.grouped_gemm stores a ragged last axis packed"
    return None


def _has_tail(p: Problem) -> bool:
    """Whether some ragged output rows/columns lie past ``sum(group_sizes)``."""
    return p.group_sizes is not None and bool(np.any(p.group_sizes.sum(axis=-1) < p.ragged_extent))


def _dimension_numbers(p: Problem) -> RaggedDotDimensionNumbers:
    nb = p.batch_ndim
    lt, rt = p.lhs_transposed, p.rhs_transposed
    if p.family == "ragged_m":
        lb = list(range(nb))
        m_ax, k_ax = (nb + 1, nb) if lt else (nb, nb + 1)
        rb = list(range(1, nb + 1))
        rk = nb + 2 if rt else nb + 1
        return RaggedDotDimensionNumbers((([k_ax], [rk]), (lb, rb)), [m_ax], [0])
    if p.family == "ragged_k":
        lb = list(range(nb))
        k_ax = nb if lt else nb + 1
        rk = nb + 1 if rt else nb
        return RaggedDotDimensionNumbers((([k_ax], [rk]), (lb, lb)), [k_ax], [])
    # batch: the group axis 0 is the ragged batch dim
    b = list(range(nb + 1))
    k_ax = nb + 1 if lt else nb + 2
    rk = nb + 2 if rt else nb + 1
    return RaggedDotDimensionNumbers((([k_ax], [rk]), (b, b)), [0], [])


def problem_from_arguments(convention: str, *args: Any, **kwargs: Any) -> Problem:
    """The problem a convention's kernel call describes (inverse of :func:`arguments`)."""
    fronts = {
        "ragged_dot": ragged_dot,
        "ragged_dot_general": ragged_dot_general,
        "megablox.gmm": gmm,
        "megablox.tgmm": tgmm,
        "torch.grouped_mm": grouped_mm,
        "te.grouped_gemm": te_grouped_gemm,
    }
    if convention not in fronts:
        raise ValueError(f"convention: expected one of {CONVENTIONS}, got {convention!r}")
    return fronts[convention](*args, with_reference=True, **kwargs).problem
