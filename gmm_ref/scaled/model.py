"""Scaled (quantized) grouped GEMM: the model, an exact reference, and the reference quantizers.

A quantized operand is its *codes* (float8_e4m3fn, float8_e5m2, float4_e2m1fn,
int8 or int4) and its *scales* (float32, bfloat16, float8_e8m0fnu or
float8_e4m3fn), one scale per block of elements. Each operand is seen per
group as a matrix ``[rows, K]``: its non-contracting axis (M for lhs, N for
rhs) by the contraction axis K. A :class:`Quantization` names the block one
scale covers in that orientation, ``(rows, k)``, ``None`` for the whole extent:

============  ==============  ===========================================
name          block           used by
============  ==============  ===========================================
``tensor``    (None, None)    per-tensor FP8 (one scale per group)
``row``       (1, None)       rowwise / per-channel FP8 and int8
``1x16``      (1, 16)         NVFP4 (e4m3 scales)
``1x32``      (1, 32)         MXFP8 / MXFP4 (e8m0 scales)
``1x128``     (1, 128)        DeepSeek-style activations
``128x128``   (128, 128)      DeepSeek-style weights
============  ==============  ===========================================

Blocks restart at every group boundary: group g's scales are an array of
shape ``(ceil(rows_g / block_rows), ceil(K_g / block_k))`` of their own, and a
partial last block covers what is left. Scales are held unswizzled here; a
front-end (``scaled_grouped_mm``) reads the physical layouts.

The reference, :func:`scaled_reference`, computes

    out[g][i, j] = sum_k  (s_a q_a)[i, k] * (s_b q_b)[j, k]

exactly (codes and scales are integers times powers of two, summed in Python
integers where float64 could round), and rounds once to the output dtype. A
NaN or Inf code or scale propagates as IEEE arithmetic says.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from gmm_ref import dtypes as _dt
from gmm_ref import families as _families

__all__ = [
    "ELEMENT_DTYPES",
    "GRANULARITIES",
    "SCALE_DTYPES",
    "SCALE_MODES",
    "MXQuantizer",
    "Quantization",
    "ScaledReference",
    "named_dtype",
    "round_exact",
    "round_scales",
    "rounded_product",
    "scaled_reference",
    "to_mx",
]

ELEMENT_DTYPES: tuple[np.dtype, ...] = tuple(np.dtype(d) for d in (
    ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2, ml_dtypes.float4_e2m1fn, np.int8, ml_dtypes.int4))
SCALE_DTYPES: tuple[np.dtype, ...] = tuple(np.dtype(d) for d in (
    np.float32, ml_dtypes.bfloat16, ml_dtypes.float8_e8m0fnu, ml_dtypes.float8_e4m3fn))
GRANULARITIES: dict[str, tuple[int | None, int | None]] = {
    "tensor": (None, None), "row": (1, None), "1x16": (1, 16), "1x32": (1, 32), "1x128": (1, 128),
    "128x128": (128, 128)}
#: how an MX quantizer picks a block's power-of-two scale from its largest magnitude (see :func:`to_mx`)
SCALE_MODES = ("floor", "ceil", "even", "rceil")
OUT_DTYPES: tuple[np.dtype, ...] = tuple(np.dtype(d) for d in (np.float64, np.float32, np.float16, ml_dtypes.bfloat16))

_NAMES = {str(d): d for d in (*ELEMENT_DTYPES, *SCALE_DTYPES, *OUT_DTYPES)}


def named_dtype(value: Any, allowed: tuple[np.dtype, ...], name: str) -> np.dtype:
    """``value`` (a dtype, its name, or torch's) as one of ``allowed``; TypeError naming ``name`` otherwise."""
    text = str(value).removeprefix("torch.")
    dtype = _NAMES.get(text)
    if dtype is None:
        try:
            dtype = np.dtype(value)
        except TypeError:
            dtype = None
    if dtype not in allowed:
        raise TypeError(f"{name}: expected one of {[str(d) for d in allowed]}, got {value!r}")
    return dtype


@dataclass(frozen=True)
class Quantization:
    """How one operand is quantized: its element dtype, its scale dtype and the block one scale covers.

    ``block`` is a name of :data:`GRANULARITIES` or ``(rows, k)`` with positive ints or None (the
    whole extent), in the operand's ``[rows, K]`` orientation (rows: M for lhs, N for rhs).
    ``global_scale``: a second level, one float32 scale per group multiplying every block scale of the
    group (NVFP4's per-tensor scale); the problem carries them (``lhs_global`` / ``rhs_global``). The block
    scales then have at most 8 significant bits (not float32), so that code x scale x global stays exact."""

    elem: Any
    scale: Any = np.float32
    block: Any = "row"
    global_scale: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "elem", named_dtype(self.elem, ELEMENT_DTYPES, "elem"))
        object.__setattr__(self, "scale", named_dtype(self.scale, SCALE_DTYPES, "scale"))
        block = GRANULARITIES.get(self.block, self.block) if isinstance(self.block, str) else self.block
        if isinstance(self.block, str) and self.block not in GRANULARITIES:
            raise ValueError(f"block: expected one of {sorted(GRANULARITIES)} or (rows, k), got {self.block!r}")
        if (not isinstance(block, tuple) or len(block) != 2
                or not all(b is None or (isinstance(b, int) and not isinstance(b, bool) and b > 0) for b in block)):
            raise ValueError(f"block: expected one of {sorted(GRANULARITIES)} or (rows, k) with positive ints or "
                             f"None, got {self.block!r}")
        object.__setattr__(self, "block", block)
        if not isinstance(self.global_scale, bool):
            raise TypeError(f"global_scale: expected a bool, got {self.global_scale!r}")
        if self.global_scale and self.scale == np.dtype(np.float32):
            raise ValueError("global_scale: a second scale level takes block scales of at most 8 significant bits "
                             "(bfloat16, float8_e8m0fnu, float8_e4m3fn), not float32")

    def describe(self) -> str:
        """Short: ``float8_e4m3fn/float32@row`` (codes, scales, block; ``*global`` with a second level)."""
        name = next((n for n, b in GRANULARITIES.items() if b == self.block), None)
        block = name or "x".join("all" if b is None else str(b) for b in self.block)
        return f"{self.elem}/{self.scale}@{block}" + ("*global" if self.global_scale else "")

    def __repr__(self) -> str:  # valid source, as reproducers print it
        tail = ", global_scale=True" if self.global_scale else ""
        return f"gmm_ref.Quantization({str(self.elem)!r}, {str(self.scale)!r}, {self.block!r}{tail})"

    def scale_shape(self, rows: int, k: int) -> tuple[int, int]:
        """The shape of one group's scales for a ``[rows, k]`` block of codes (a partial last block counts)."""
        br, bk = self.block
        return (1 if br is None else -(-rows // br) if rows else 0, 1 if bk is None else -(-k // bk) if k else 0)

    def expand(self, scales: np.ndarray, rows: int, k: int) -> np.ndarray:
        """One group's scales repeated over its ``[rows, k]`` elements (float64)."""
        br, bk = self.block
        s = np.asarray(scales).astype(np.float64)
        s = np.repeat(s, rows if br is None else br, axis=0)[:rows]
        return np.repeat(s, k if bk is None else bk, axis=1)[:, :k]


# ----------------------------------------------------------------------------------- exact arithmetic
def _int_exponent(dtype: np.dtype) -> int:
    """The exponent e0 such that every finite value of ``dtype`` is an integer times 2**e0."""
    if _dt.is_integer(dtype):
        return 0
    info = ml_dtypes.finfo(dtype)
    return int(info.minexp) - int(info.nmant)


def _as_scaled_ints(x: np.ndarray) -> tuple[np.ndarray, int]:
    """Finite float64 values ``x`` as int64 ``n`` and ``e`` with ``x == n * 2**e`` exactly (``n`` small)."""
    x = np.asarray(x, np.float64)
    nonzero = x[x != 0]
    if nonzero.size == 0:
        return np.zeros(x.shape, np.int64), 0
    m, e = np.frexp(nonzero)  # nonzero = m * 2**e, 0.5 <= |m| < 1, 53 significant bits at most
    mi = np.abs(np.ldexp(m, 53).astype(np.int64))
    lowest_bit = np.log2((mi & -mi).astype(np.float64)).astype(np.int64)  # trailing zeros of each mantissa
    exponent = int(np.min(e - 53 + lowest_bit))  # every value is an integer multiple of 2**exponent
    n = np.ldexp(x, -exponent)
    if np.max(np.abs(n)) >= 2.0**62:
        raise OverflowError("values too far apart for int64")  # never for one code dtype's values
    return n.astype(np.int64), exponent


def _block_sums(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, int]:
    """``a @ b.T`` of finite float64 values exactly: (Python-int object array or int64, exponent)."""
    na, ea = _as_scaled_ints(a)
    nb, eb = _as_scaled_ints(b)
    k = a.shape[1]
    top = float(np.max(np.abs(na), initial=0)) * float(np.max(np.abs(nb), initial=0)) * max(k, 1)
    if top < 2.0**53:  # every partial sum is an integer float64 holds exactly
        return (na.astype(np.float64) @ nb.astype(np.float64).T).astype(np.int64), ea + eb
    return na.astype(object) @ nb.astype(object).T, ea + eb


def _scale_ints(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Finite float64 scales as (int64 mantissas, int64 exponents) elementwise: s == m * 2**e."""
    m, e = np.frexp(np.asarray(s, np.float64))
    return np.ldexp(m, 53).astype(np.int64), e.astype(np.int64) - 53


def round_exact(numerator: int, exponent: int, dtype: Any) -> float:
    """``numerator * 2**exponent`` rounded once, to nearest even, into ``dtype``'s values (as a float)."""
    fmt = _dt.float_format(np.dtype(dtype))
    if numerator == 0:
        return 0.0
    sign = -1.0 if numerator < 0 else 1.0
    n = abs(numerator)
    top = n.bit_length() - 1 + exponent  # floor(log2(value))
    quantum = max(top, fmt.emin) - fmt.mant  # log2 of the spacing of dtype's values there
    shift = quantum - exponent
    if shift > 0:
        q, r = divmod(n, 1 << shift)
        half = 1 << (shift - 1)
        if r > half or (r == half and q & 1):
            q += 1
        n, exponent = q, quantum
    try:
        value = math.ldexp(float(n), exponent)  # n has at most mant + 2 bits here: exact
    except OverflowError:
        value = math.inf
    if value > fmt.max_finite:
        value = math.inf if fmt.has_inf else math.nan
    return sign * value


def _nearest(n: Any, e: int, dtype: np.dtype) -> np.ndarray:
    """Rounded once into ``dtype`` (elementwise over an int array ``n`` times 2**e)."""
    flat = np.asarray(n, dtype=object).reshape(-1)
    out = np.array([round_exact(int(v), e, dtype) for v in flat], np.float64)
    return out.reshape(np.shape(n))


def round_scales(values: Any, dtype: Any) -> np.ndarray:
    """``values`` (float64) rounded once to nearest even into a scale dtype. e8m0 holds powers of two only:
    ``values`` must be powers of two there (they convert exactly)."""
    dtype = np.dtype(dtype)
    if ml_dtypes.finfo(dtype).nmant == 0:
        return np.asarray(values, np.float64).astype(dtype)
    return _dt.round_to(values, dtype)


def rounded_product(a: np.ndarray, b: np.ndarray, out_dtype: Any) -> np.ndarray | None:
    """``a @ b`` of finite float64 values (``[m, k] @ [k, n]``) computed exactly and rounded once into
    ``out_dtype``; None where the values span too many binades for int64 mantissas."""
    try:
        sums, e = _block_sums(a, b.T)
    except OverflowError:
        return None
    return _nearest(sums, e, np.dtype(out_dtype))


# ------------------------------------------------------------------------------------ the reference
@dataclass(frozen=True)
class ScaledReference:
    """The exact result of a scaled grouped GEMM: ``exact`` (the float64 nearest), ``values`` (rounded once to
    the output dtype) and ``magnitude`` (``sum_k |a||b|`` in float64, for error bounds)."""

    exact: np.ndarray
    values: np.ndarray
    magnitude: np.ndarray


def _group_product(a_codes: np.ndarray, a_scales: np.ndarray, qa: Quantization, b_codes: np.ndarray,
                   b_scales: np.ndarray, qb: Quantization, out_dtype: np.dtype, ga: float = 1.0, gb: float = 1.0
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One group: ``[M, K]`` lhs and ``[N, K]`` rhs codes with their scales -> (exact, rounded, magnitude)."""
    m, k = a_codes.shape
    n = b_codes.shape[0]
    for name, s, q, rows in (("lhs", a_scales, qa, m), ("rhs", b_scales, qb, n)):
        if np.shape(s) != q.scale_shape(rows, k):
            raise ValueError(f"{name} scales: expected shape {q.scale_shape(rows, k)} for a [{rows}, {k}] block of "
                             f"{q.block} scales, got {np.shape(s)}")
    if m == 0 or n == 0 or k == 0:
        z = np.zeros((m, n))
        return z, z, z
    ca, cb = a_codes.astype(np.float64), b_codes.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        sa, sb = qa.expand(a_scales, m, k) * ga, qb.expand(b_scales, n, k) * gb  # every element's scale
        da, db = ca * sa, cb * sb
        magnitude = np.abs(da) @ np.abs(db).T
        ieee = da @ db.T  # where an input is NaN or Inf, IEEE arithmetic decides the result
    # the exact sums below see NaN and Inf as 0; the elements they reach take the IEEE result instead
    ca, cb = (np.nan_to_num(c, nan=0.0, posinf=0.0, neginf=0.0) for c in (ca, cb))
    sa, sb = (np.nan_to_num(s, nan=0.0, posinf=0.0) for s in (sa, sb))
    # split K where either operand's scale changes; inside a segment both scales are constant per row
    cuts = {0, k}
    for q in (qa, qb):
        if q.block[1] is not None:
            cuts.update(range(0, k, q.block[1]))
    cuts_sorted = sorted(cuts)
    total = np.zeros((m, n), dtype=object)
    parts = []
    for lo, hi in itertools.pairwise(cuts_sorted):
        sums, e_codes = _block_sums(ca[:, lo:hi], cb[:, lo:hi])
        ma, xa = _scale_ints(sa[:, lo])  # constant over the piece, per row
        mb, xb = _scale_ints(sb[:, lo])
        parts.append((sums, e_codes, ma, xa, mb, xb))
    e_total = min(e + int(np.min(xa, initial=0)) + int(np.min(xb, initial=0)) for _, e, _, xa, _, xb in parts)
    for sums, e_codes, ma, xa, mb, xb in parts:
        # term[i, j] = sums[i, j] * ma[i] * mb[j] * 2**(e_codes + xa[i] + xb[j]), shifted to the common exponent
        sh_a = (xa - int(np.min(xa, initial=0))).astype(object)
        sh_b = (xb - int(np.min(xb, initial=0))).astype(object)
        base = e_codes + int(np.min(xa, initial=0)) + int(np.min(xb, initial=0)) - e_total
        left = np.array([int(v) << int(s) for v, s in zip(ma, sh_a, strict=True)], dtype=object)
        right = np.array([int(v) << int(s) for v, s in zip(mb, sh_b, strict=True)], dtype=object)
        total += sums.astype(object) * left[:, None] * right[None, :] * (1 << base)
    exact = _nearest(total, e_total, np.dtype(np.float64))
    values = _nearest(total, e_total, out_dtype)
    poisoned = ~np.isfinite(ieee)
    exact = np.where(poisoned, ieee, exact)
    values = np.where(poisoned, ieee, values)
    return exact, values, magnitude


def _check_codes(name: str, codes: Any, quant: Quantization) -> np.ndarray:
    arr = np.asarray(codes)
    if arr.dtype != quant.elem:
        raise TypeError(f"{name}: expected codes of dtype {quant.elem} (its Quantization's elem), got {arr.dtype}")
    return arr


def _offsets(group_sizes: Any, extent: int, name: str = "group_sizes") -> np.ndarray:
    gs = np.asarray(group_sizes)
    if gs.ndim != 1 or not np.issubdtype(gs.dtype, np.integer):
        raise TypeError(f"{name}: expected a 1-D integer array, got {gs.dtype} of shape {gs.shape}")
    if np.any(gs < 0) or int(gs.sum()) > extent:
        raise ValueError(f"{name}: expected non-negative sizes summing to at most {extent}, got {gs.tolist()}")
    return np.concatenate([[0], np.cumsum(gs.astype(np.int64))])


def scaled_reference(lhs: Any, lhs_scales: Sequence[Any], rhs: Any, rhs_scales: Sequence[Any],
                     group_sizes: Any, *, lhs_quant: Quantization, rhs_quant: Quantization,
                     family: str = "ragged_m", out_dtype: Any = ml_dtypes.bfloat16,
                     lhs_global: Sequence[float] | None = None, rhs_global: Sequence[float] | None = None
                     ) -> ScaledReference:
    """The exact scaled grouped GEMM, rounded once to ``out_dtype``.

    Canonical layouts (as :class:`gmm_ref.Problem`'s): ``ragged_m`` lhs ``[T, K]``, rhs ``[G, K, N]``, out
    ``[T, N]`` (rows past the groups are 0); ``ragged_n`` lhs ``[G, M, K]``, rhs ``[K, T]``, out ``[M, T]``;
    ``ragged_k`` lhs ``[M, T]``, rhs ``[T, N]``, out ``[G, M, N]``; ``batch`` lhs ``[G, M, K]``, rhs
    ``[G, K, N]``, out ``[G, M, N]``. ``lhs_scales[g]`` and ``rhs_scales[g]`` are group g's scales in the
    ``[rows, K]`` orientation (``Quantization.scale_shape``); ``lhs_global``/``rhs_global`` are optional
    per-group float32 global scales (NVFP4)."""
    if family not in _families.ragged_names():
        raise ValueError(f"family: expected one of {', '.join(_families.ragged_names())}, got {family!r}")
    facts = _families.get(family)
    for name, q in (("lhs_quant", lhs_quant), ("rhs_quant", rhs_quant)):
        if not isinstance(q, Quantization):
            raise TypeError(f"{name}: expected a gmm_ref.scaled.model.Quantization, got {q!r}")
    out_dtype = named_dtype(out_dtype, OUT_DTYPES, "out_dtype")
    a = _check_codes("lhs", lhs, lhs_quant)
    b = _check_codes("rhs", rhs, rhs_quant)
    lead_a, lead_b = int(facts.is_grouped("lhs")), int(facts.is_grouped("rhs"))
    want = (2 + lead_a, 2 + lead_b)
    if (a.ndim, b.ndim) != want:
        raise ValueError(f"lhs, rhs: {family} expects {want[0]}-D lhs and {want[1]}-D rhs, got {a.ndim}-D and "
                         f"{b.ndim}-D")
    k_a, k_b = lead_a + 1, lead_b
    if a.shape[k_a] != b.shape[k_b]:
        raise ValueError(f"lhs, rhs: contraction extents differ ({a.shape} and {b.shape} for {family})")
    m, k, n = a.shape[lead_a], a.shape[k_a], b.shape[lead_b + 1]
    g = len(group_sizes) if facts.takes_sizes else a.shape[0]
    if not facts.takes_sizes:
        offs = np.arange(g + 1)
    else:
        offs = _offsets(group_sizes, facts.extent(m, k, n))
    if len(lhs_scales) != g or len(rhs_scales) != g:
        raise ValueError(f"lhs_scales, rhs_scales: expected one scale array per group ({g}), got {len(lhs_scales)} "
                         f"and {len(rhs_scales)}")
    ga = [1.0] * g if lhs_global is None else [float(x) for x in lhs_global]
    gb = [1.0] * g if rhs_global is None else [float(x) for x in rhs_global]
    if len(ga) != g or len(gb) != g:
        raise ValueError(f"lhs_global, rhs_global: expected one global scale per group ({g})")
    shape = facts.shape("out", m, k, n, g)
    exact, values, mag = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    for i in range(g):
        lo, hi = int(offs[i]), int(offs[i + 1])
        blocks = (a[facts.index("lhs", i, lo, hi)], b[facts.index("rhs", i, lo, hi)].T)
        where = facts.index("out", i, lo, hi)
        e, v, m = _group_product(blocks[0], np.asarray(lhs_scales[i]), lhs_quant, blocks[1],
                                 np.asarray(rhs_scales[i]), rhs_quant, out_dtype, ga[i], gb[i])
        exact[where], values[where], mag[where] = e, v, m
    return ScaledReference(exact=exact, values=values.astype(out_dtype), magnitude=mag)


# --------------------------------------------------------------------------------------- quantizers
def _target_max_pow2(elem: np.dtype) -> int:
    """floor(log2) of the element dtype's largest finite value (e4m3: 8, e5m2: 15, e2m1: 2)."""
    return math.floor(math.log2(float(ml_dtypes.finfo(elem).max)))


def _mx_exponents(amax: np.ndarray, elem: np.dtype, mode: str) -> np.ndarray:
    """The unbiased exponents of blocks' e8m0 scales (clamped to [-127, 127]; 128 for the NaN scale), exactly:
    every step is a power-of-two scaling or a comparison of float64 values."""
    emax = _target_max_pow2(elem)
    top = float(ml_dtypes.finfo(elem).max)
    regular = np.isfinite(amax) & (amax > 0)
    a = np.where(regular, amax, 1.0)
    m, ex = np.frexp(a)  # a = m * 2**ex, 0.5 <= m < 1: floor(log2(a)) = ex - 1
    floor = ex.astype(np.int64) - 1
    if mode == "rceil":  # the smallest e with a <= top * 2**e (top * 2**e is exact in float64)
        e = np.ceil(np.log2(a / top)).astype(np.int64)
        e = np.where(a > np.ldexp(top, e), e + 1, e)
        e = np.where(a <= np.ldexp(top, e - 1), e - 1, e)
    elif mode == "ceil":  # ceil(log2(a)) - emax: never saturates, may flush small elements
        e = np.where(m == 0.5, floor, floor + 1) - emax
    elif mode == "even":  # a rounded to nearest even at the element's precision first
        mbits = int(ml_dtypes.finfo(elem).nmant)
        q = np.rint(np.ldexp(m, mbits + 1))  # exact scaling; rint rounds half to even
        e = np.where(q >= 2.0 ** (mbits + 1), floor + 1, floor) - emax
    else:
        e = floor - emax
    e = np.clip(e, -127, 127)
    e = np.where(amax == 0, -127, e)
    # an Inf keeps a finite scale, as a float32 amax of +inf gives it (its exponent field read as 128)
    e = np.where(np.isinf(amax), 127 if mode == "rceil" else min(127, 128 - emax), e)
    return np.where(np.isnan(amax), 128, e)


def to_mx(x: Any, block_size: int = 32, elem_dtype: Any = ml_dtypes.float8_e4m3fn, scale_mode: str = "floor"
          ) -> tuple[np.ndarray, np.ndarray]:
    """The reference MX quantizer: ``x`` (``[..., K]``, float) -> (codes, e8m0 scales ``[..., ceil(K / block_size)]``).

    Each block of ``block_size`` consecutive elements of the last axis gets a power-of-two scale ``2**e`` from its
    largest magnitude ``amax`` (``scale_mode``; ``emax``: floor(log2) of the element dtype's largest value):

    - ``floor`` (the OCP MX specification): ``e = floor(log2(amax)) - emax``; values past the element's range
      saturate;
    - ``ceil``: ``e = ceil(log2(amax)) - emax`` (never saturates; small elements may flush to zero);
    - ``even``: amax rounded to nearest even at the element's precision first, then as ``floor``;
    - ``rceil``: ``e = ceil(log2(amax / max))``, the smallest scale that needs no saturation.

    ``e`` is clamped to [-127, 127]; an all-zero block gets 2**-127; a block holding a NaN gets the NaN scale
    (0xFF). A block holding an Inf (and no NaN) gets a finite scale, as float32 arithmetic on an amax of +inf
    gives it (torchao's ``to_mx``, and the saturating conversion of NVIDIA's hardware): ``rceil`` 2**127,
    the others ``2**(128 - emax)``; its Inf codes saturate. Codes are ``x / 2**e`` rounded once to nearest
    even into the element dtype, saturated to its largest finite value."""
    elem = named_dtype(elem_dtype, ELEMENT_DTYPES[:3], "elem_dtype")
    if scale_mode not in SCALE_MODES:
        raise ValueError(f"scale_mode: expected one of {SCALE_MODES}, got {scale_mode!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
    arr = np.asarray(x)
    try:
        ml_dtypes.finfo(arr.dtype)
        is_float = arr.dtype.kind != "i"
    except (ValueError, TypeError):
        is_float = False
    if arr.ndim < 1 or not is_float:
        raise TypeError(f"x: expected a float array of at least one dimension, got {arr.dtype} {arr.shape}")
    xf = arr.astype(np.float64)
    k = xf.shape[-1]
    nblocks = -(-k // block_size)
    flat = xf.reshape(math.prod(xf.shape[:-1]), k)  # (not -1: K may be 0)
    padded = np.zeros((flat.shape[0], nblocks * block_size))
    padded[:, :k] = np.abs(flat)  # zeros past K change no block's largest magnitude
    blocks = padded.reshape(flat.shape[0], nblocks, block_size)
    has_nan = np.isnan(blocks).any(axis=-1)
    amax = np.where(has_nan, np.nan, np.max(np.where(np.isnan(blocks), 0.0, blocks), axis=-1, initial=0.0))
    exps = _mx_exponents(amax, elem, scale_mode)
    nan_scale = exps == 128
    scale = np.ldexp(1.0, np.where(nan_scale, 0, exps))
    full = np.repeat(scale, block_size, axis=1)[:, :k]
    limit = float(ml_dtypes.finfo(elem).max)
    with np.errstate(invalid="ignore"):
        scaled = np.clip(flat / full, -limit, limit)  # exact: the scale is a power of two
    codes = _dt.round_to(scaled, elem).reshape(arr.shape)  # once, to nearest even; saturated, so it stays finite
    scales = np.where(nan_scale, np.nan, scale).astype(ml_dtypes.float8_e8m0fnu).reshape(*arr.shape[:-1], nblocks)
    return codes, scales


# ------------------------------------------------------------------------- kernels that quantize inside
@dataclass(frozen=True)
class MXQuantizer:
    """The format of a kernel that quantizes its (high-precision) inputs itself to MX: ``elem`` codes with one
    e8m0 scale per ``block_size`` consecutive elements along K, picked by ``scale_mode`` (see :func:`to_mx`)."""

    elem: Any = ml_dtypes.float8_e4m3fn
    block_size: int = 32
    scale_mode: str = "rceil"

    def __post_init__(self) -> None:
        object.__setattr__(self, "elem", named_dtype(self.elem, ELEMENT_DTYPES[:3], "elem"))
        if isinstance(self.block_size, bool) or not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size: expected a positive int, got {self.block_size!r}")
        if self.scale_mode not in SCALE_MODES:
            raise ValueError(f"scale_mode: expected one of {SCALE_MODES}, got {self.scale_mode!r}")

    @property
    def quantization(self) -> Quantization:
        """The :class:`Quantization` of the codes and scales it makes."""
        return Quantization(self.elem, ml_dtypes.float8_e8m0fnu, (1, self.block_size))

    def describe(self) -> str:
        """Short: ``float8_e4m3fn/32/rceil`` (codes, block size, scale mode)."""
        return f"{self.elem}/{self.block_size}/{self.scale_mode}"

    def quantize(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``x`` (``[rows, K]``) -> (codes, e8m0 scales ``[rows, ceil(K / block_size)]``)."""
        return to_mx(np.asarray(x, np.float64), self.block_size, self.elem, self.scale_mode)

    def __repr__(self) -> str:  # valid source, as reproducers print it
        return f"gmm_ref.MXQuantizer({str(self.elem)!r}, {self.block_size}, {self.scale_mode!r})"
