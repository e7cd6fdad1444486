"""Operand values by kind (exact small integers, normal, wide, poisoned) and poisoned padding."""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

import gmm_ref
from gmm_ref import dtypes as _dt
from gmm_ref.dtypes import standin_codes
from gmm_ref.layouts import blocks as _blocks
from gmm_ref.scaled.model import round_scales

__all__ = ["VALUE_KINDS", "few", "fill", "fill_codes", "fill_global_scales", "fill_scales", "poison",
           "scaled_problem", "unused_elements"]

VALUE_KINDS = ("exact", "normal", "wide", "poisoned")


def _sig_limit(dtype: Any) -> float:
    dtype = np.dtype(dtype)
    if _dt.is_integer(dtype):
        return float(_dt.iinfo(dtype).max)
    return 2.0 ** (_dt.float_format(dtype).mant + 1)


def fill(rng: np.random.Generator, shape: Any, dtype: Any, kind: str, k: int, out_dtype: Any, seed: int) -> np.ndarray:
    dtype = np.dtype(dtype)
    if _dt.is_integer(dtype) and kind != "exact":
        # the whole range (int8, int4): int32 accumulation stays exact (K < 2**17), while a kernel
        # that accumulates or stores in a narrower integer wraps
        info = _dt.iinfo(dtype)
        return rng.integers(int(info.min), int(info.max), size=shape, endpoint=True).astype(dtype)
    if kind == "exact" or _dt.is_integer(dtype):
        lim = min(_sig_limit(out_dtype), _sig_limit(np.float32), _sig_limit(dtype)) / 2
        a = int(max(1, min(4, math.isqrt(int(lim // max(k, 1))))))
        # |v| <= 4: int8 holds them and every dtype represents them exactly
        return rng.integers(-a, a + 1, size=shape, dtype=np.int8).astype(dtype)
    if kind == "normal":
        return rng.standard_normal(size=shape, dtype=np.float32).astype(dtype, copy=False)
    # wide: log-uniform magnitudes from the input's subnormals to where K products
    # of two of them reach the output's overflow threshold
    fin, fout = _dt.float_format(dtype), _dt.float_format(out_dtype)
    lo = fin.emin - fin.mant
    hi = min(fin.emax, math.floor(0.5 * (math.log2(fout.max_finite) - math.log2(max(k, 1)))))
    hi = max(hi, lo)
    if fin.has_inf and dtype.itemsize in (2, 4):
        return _wide_bits(rng, shape, dtype, fin, hi - lo)
    exp = rng.integers(lo, hi + 1, size=shape)
    # mantissas near 2 at the top exponent would round past the largest finite value
    mag = np.minimum(np.ldexp(rng.uniform(1.0, 2.0, size=shape), exp), fin.max_finite)
    mag[rng.random(size=shape) < 0.1] = 0.0
    mag = np.where(rng.random(size=shape) < 0.5, -mag, mag)
    return mag.astype(np.float32).astype(dtype) if dtype != np.dtype(np.float64) else mag


def fill_codes(rng: np.random.Generator, shape: Any, dtype: Any, kind: str, k: int, out_dtype: Any,
               seed: int) -> np.ndarray:
    """Codes of a scaled operand. ``exact``: small integers (as :func:`fill`); ``normal``: values a quantizer
    makes of normal data (spread over the codes' whole range, up to +-max); ``wide``: every finite code
    equally likely (zeros, subnormals, +-max). Integer codes: their whole range but for ``exact``."""
    dtype = np.dtype(dtype)
    if kind == "exact" or _dt.is_integer(dtype):
        return fill(rng, shape, dtype, kind, k, out_dtype, seed)
    if kind == "normal":
        fmt = _dt.float_format(dtype)
        top = rng.uniform(0.25, 1.0) * fmt.max_finite / 3  # about 3 sigma at the top of the range
        return _dt.round_to(np.clip(rng.standard_normal(size=shape) * top, -fmt.max_finite, fmt.max_finite), dtype)
    # every bit pattern the codes have (4 bits of float4_e2m1fn, held one per byte)
    width = 16 if dtype == np.dtype(ml_dtypes.float4_e2m1fn) else 256
    bits = rng.integers(0, width, size=shape, dtype=np.uint8).view(dtype)
    finite = np.isfinite(bits.astype(np.float64))
    return np.where(finite, bits, np.zeros((), dtype)).astype(dtype)


def fill_scales(rng: np.random.Generator, count: int, quant: Any, kind: str, k: int, out_dtype: Any) -> np.ndarray:
    """``count`` scales of ``quant.scale``'s dtype. ``exact``: 1 or 2 (exact products stay small integers);
    ``normal``: what amax / max gives for data of unit scale (a float32 or bfloat16 scale is not a power of
    two); ``wide``: powers of two (times a mantissa where the dtype has one) from 2**-40 up to where K
    products of two fully scaled codes near the output's overflow."""
    code_max = float(_dt.iinfo(quant.elem).max if _dt.is_integer(quant.elem) else ml_dtypes.finfo(quant.elem).max)
    if kind == "exact":
        vals = np.ldexp(1.0, rng.integers(0, 2, size=count))
    elif kind == "normal":
        vals = rng.uniform(0.5, 2.0, size=count) * 3.0 / code_max
    else:
        fout = _dt.float_format(out_dtype)
        hi = math.floor(0.5 * (math.log2(fout.max_finite) - math.log2(max(k, 1))) - math.log2(code_max)) - 1
        exp = rng.integers(-40, max(hi, -40) + 1, size=count)
        mant = ml_dtypes.finfo(quant.scale).nmant
        vals = np.ldexp(rng.uniform(1.0, 2.0, size=count) if mant else np.ones(count), exp)
    return round_scales(vals, quant.scale)


def fill_global_scales(rng: np.random.Generator, count: int, kind: str) -> np.ndarray:
    """``count`` float32 second-level scales (one per group), different per group. ``exact``: 1 or 2;
    ``normal``: in [1/2, 2); ``wide``: a float32 mantissa times 2**-20 .. 2**-1 (below 1: the block scales
    already reach the output's range)."""
    if kind == "exact":
        vals = np.ldexp(1.0, rng.integers(0, 2, size=count))
    elif kind == "normal":
        vals = rng.uniform(0.5, 2.0, size=count)
    else:
        vals = np.ldexp(rng.uniform(1.0, 2.0, size=count), rng.integers(-20, 0, size=count))
    return vals.astype(np.float32)


def _wide_bits(rng: np.random.Generator, shape: Any, dtype: np.dtype, fin: Any, span: int) -> np.ndarray:
    """``wide`` values built as bit patterns: exponent ``emin - mant + d`` for a uniform
    ``d`` in ``[0, span]`` (subnormals below ``emin``), uniform mantissa and sign, ~10% zeros.

    No float arithmetic, so no slow subnormal operations or narrowing casts, few
    temporaries, and never a rounding past the largest finite value.
    """
    mant, width = fin.mant, 8 * dtype.itemsize
    u32 = np.uint32
    n = math.prod(shape)
    r = rng.integers(0, 1 << 32, size=n, dtype=u32)  # mantissa, sign, zero-or-not
    d = rng.integers(0, span + 1, size=n, dtype=u32)  # exponent above the smallest subnormal's
    zero = r < u32(26 << 24)  # top byte below 26: ~10%
    sign = r >> u32(mant)
    sign &= u32(1)
    sign <<= u32(width - 1)
    r &= u32((1 << mant) - 1)
    r |= u32(1 << mant)  # the significand 1.m as an integer
    shift = np.minimum(d, u32(mant))
    np.subtract(u32(mant), shift, out=shift)  # d < mant: a subnormal, shifted right
    r >>= shift
    del shift
    np.maximum(d, u32(mant), out=d)
    d -= u32(mant)
    d <<= u32(mant)  # the exponent field; 0 for subnormals
    r += d  # a normal's implicit bit carries into the exponent field
    del d
    r |= sign
    r[zero] = 0
    bits = r if width == 32 else r.astype(np.uint16)
    return bits.view(dtype).reshape(shape)


def unused_elements(family: str, lhs_shape: Any, rhs_shape: Any, sizes: Any, common: dict
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Masks of the lhs and rhs elements that no (local) group reads: an element is read when it
    meets a block that produces at least one output element (an empty group's weights are not)."""
    lhs_index = np.arange(math.prod(lhs_shape), dtype=np.float64).reshape(lhs_shape)
    rhs_index = np.arange(math.prod(rhs_shape), dtype=np.float64).reshape(rhs_shape)
    q = gmm_ref.Problem(family, lhs_index, rhs_index, sizes, **{**common, "out_dtype": np.float64,
                                                                "existing_out": None,
                                                                "existing_policy": "overwrite"})
    lu = np.ones(lhs_index.size, bool)
    ru = np.ones(rhs_index.size, bool)
    for blk in _blocks(q):
        if blk.b.shape[1] > 0:
            lu[blk.a.astype(np.int64).ravel()] = False
        if blk.a.shape[0] > 0:
            ru[blk.b.astype(np.int64).ravel()] = False
    return lu.reshape(lhs_shape), ru.reshape(rhs_shape)


def few(rng: np.random.Generator, where: np.ndarray, most: int = 2) -> np.ndarray:
    """A mask of at most ``most`` positions chosen among ``where``."""
    picked = np.zeros(where.shape, bool)
    flat = np.flatnonzero(where)
    if flat.size:
        picked.flat[rng.choice(flat, size=min(most, flat.size), replace=False)] = True
    return picked


def poison(rng: np.random.Generator, arr: np.ndarray, unused: np.ndarray) -> None:
    """NaN or +-Inf (where the dtype has them) in every element of ``arr`` that ``unused`` marks, in place."""
    if _dt.is_integer(arr.dtype):
        return
    count = int(np.count_nonzero(unused))
    if not count:
        return
    has_inf = _dt.float_format(arr.dtype).has_inf
    choices = np.array([np.nan, np.inf, -np.inf] if has_inf else [np.nan])
    arr[unused] = choices[rng.integers(0, len(choices), size=count)].astype(arr.dtype)


def scaled_problem(rng: np.random.Generator, family: str, lhs: np.ndarray, rhs: np.ndarray, sizes: Any,
                   quants: tuple[Any, Any], kind: str, k: int, fields: dict[str, Any]) -> gmm_ref.Problem:
    """The scaled problem of the codes ``lhs`` and ``rhs`` (each of its quantization's element dtype, or the input
    dtype where ``quants`` leaves it unscaled): the codes as a problem of their own (its output dtype theirs),
    then scaled by ``quants`` with scales of ``kind`` (:func:`values.fill_scales`); ``fields`` are the problem's
    other fields, ``out_dtype`` and ``existing_out`` included (the strategies' draws and the scale mode's cells)."""
    # 4-bit codes stand in as the 8-bit codes holding their values; _scaled puts them back
    lc, rc = standin_codes(lhs), standin_codes(rhs)
    codes = gmm_ref.Problem(family, lc, rc, sizes, **{**fields, "existing_out": None,
                                                      "out_dtype": None if lc.dtype == rc.dtype else np.float32})
    return _scaled(rng, codes, quants, kind, k, fields["out_dtype"], fields.get("existing_out"), (lhs, rhs))


def _scaled(rng: np.random.Generator, p: gmm_ref.Problem, quants: tuple[Any, Any], kind: str, k: int,
            out_dtype: Any, existing_out: Any = None, codes: tuple[np.ndarray, np.ndarray] | None = None
            ) -> gmm_ref.Problem:
    """``p`` with its codes scaled by ``quants`` (one scale per block of every local group) and ``out_dtype``;
    ``codes``: the operands' own codes where ``p`` holds stand-ins."""
    extra: dict[str, Any] = {} if codes is None else {"lhs": codes[0], "rhs": codes[1]}
    for name, q in zip(("lhs", "rhs"), quants, strict=True):
        if q is not None:
            count = sum(math.prod(shape) for shape in p.scale_shapes(name, q))
            extra.update({f"{name}_quant": q, f"{name}_scales": fill_scales(rng, count, q, kind, k, out_dtype)})
            if q.global_scale:
                extra[f"{name}_global"] = fill_global_scales(rng, p.num_local_groups, kind)
    return p.replace(**extra, out_dtype=out_dtype, existing_out=existing_out)
