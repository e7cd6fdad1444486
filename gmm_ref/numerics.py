"""What a kernel declares about its arithmetic, and the error bound it earns.

For every defined output element (docs/numerics.md)::

    bound = (2*u_in + gamma(K_ij, u_acc) + gamma(K_ij + 1, u_ref)) * (|A||B|)_ij
            + u_out * |C_ij| + tiny_out

For a scaled problem ``A`` and ``B`` are the dequantized values (scale * code)
and ``K_ij`` counts one more rounding per scaled operand (its scale applied to a
partial sum); a kernel that dequantizes first into a narrower type declares it as
``multiply`` (the dequantized values pass through it). A kernel that keeps partial
sums of ``L = promote_every`` terms in a precision of their own (``partial_accumulate``)
and promotes them into the accumulator earns
``(1 + gamma(L, u_partial)) * (1 + gamma(ceil(K / L) + 2, u_acc))`` in place of
``1 + gamma(K_ij, u_acc)``.

``u_ref = 2**-53`` accounts for the float64 reference itself (its products
are exact for inputs of float32 or narrower; its sums are not). When every
input of an element's group is an integer small enough for the multiply
precision, and ``(|A||B|)_ij`` fits the accumulator's and output's
significands, every partial sum is exact whatever the order: the bound is 0
and the kernel must match bit for bit (exact mode).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gmm_ref import dtypes as _dt
from gmm_ref.layouts import blocks
from gmm_ref.problem import Problem

__all__ = ["Numerics", "default_numerics", "error_bound", "gamma", "min_normal", "parse_numerics"]

U_REF = 2.0 ** -53


def gamma(k: Any, u: float) -> Any:
    """``k*u / (1 - k*u)``, the classical bound on k roundings of unit roundoff u."""
    ku = np.asarray(k, dtype=np.float64) * u
    with np.errstate(divide="ignore"):
        return np.where(ku < 1, ku / np.maximum(1 - ku, 1e-300), np.inf)


def _representable(src: np.dtype, dst: np.dtype) -> bool:
    """Whether every finite value of ``src`` is exact in ``dst``."""
    if _dt.is_integer(src):
        bits = _dt.iinfo(src).bits
        return _dt.is_integer(dst) or _dt.float_format(dst).mant + 1 >= bits - 1
    if _dt.is_integer(dst):
        return False
    s, d = _dt.float_format(src), _dt.float_format(dst)
    return s.mant <= d.mant and s.emax <= d.emax and s.emin - s.mant >= d.emin - d.mant


@dataclass(frozen=True)
class Numerics:
    """A kernel's arithmetic: the precision it multiplies in and its accumulator.

    ``multiply=None`` means products are formed exactly (as float32 or
    narrower inputs multiplied into a float32 accumulator are); a dtype means
    the inputs pass through it first (e.g. bfloat16 for TPU DEFAULT precision).
    """

    multiply: Any = None
    accumulate: Any = np.float32
    #: subnormal inputs, products, partial sums and outputs may be flushed to zero
    #: (FTZ/DAZ, as XLA on CPU and most GPU/TPU paths do): widens the bound by the
    #: flushed terms and the smallest normals of the accumulator and the output.
    flush_subnormals: bool = False
    #: partial sums of at most this many K terms are kept apart and then promoted (scales applied) into the
    #: ``accumulate`` accumulator: DeepGEMM's SM90 FP8 kernels promote every 128 (None: one accumulator over K)
    promote_every: int | None = None
    #: the precision of those partial sums: a dtype, or the unit roundoff of an accumulator that is none
    #: (Hopper's FP8 tensor cores keep about 14 significant bits, truncating: ``2**-13``); None: ``accumulate``
    partial_accumulate: Any = None

    def __post_init__(self) -> None:
        if self.multiply is not None:
            object.__setattr__(self, "multiply", _dt.as_dtype(self.multiply, name="multiply"))
        object.__setattr__(self, "accumulate", _dt.as_dtype(self.accumulate, name="accumulate"))
        if not isinstance(self.flush_subnormals, (bool, np.bool_)):
            raise TypeError(f"flush_subnormals: expected a bool, got {self.flush_subnormals!r}")
        every = self.promote_every
        if every is not None and (isinstance(every, bool) or not isinstance(every, (int, np.integer)) or every < 1):
            raise ValueError(f"promote_every: expected a positive int (K terms per partial sum) or None, got {every!r}")
        part = self.partial_accumulate
        if part is not None:
            if every is None:
                raise ValueError("partial_accumulate: given without promote_every (how many K terms a partial sum "
                                 "holds)")
            if isinstance(part, float) or (isinstance(part, (int, np.floating)) and not isinstance(part, bool)):
                if not 0 < float(part) < 1:
                    raise ValueError(f"partial_accumulate: expected a dtype or a unit roundoff in (0, 1), got {part!r}")
                object.__setattr__(self, "partial_accumulate", float(part))
            else:
                object.__setattr__(self, "partial_accumulate", _dt.as_dtype(part, name="partial_accumulate"))

    def __repr__(self) -> str:  # the promotion fields only where a kernel declares them
        extra = (f", promote_every={self.promote_every!r}, partial_accumulate={self.partial_accumulate!r}"
                 if self.promote_every is not None else "")
        return (f"Numerics(multiply={self.multiply!r}, accumulate={self.accumulate!r}, "
                f"flush_subnormals={self.flush_subnormals!r}{extra})")

    def to_json(self) -> dict[str, Any]:
        """Every field as JSON (the fields at their defaults left out but for the first three)."""
        out: dict[str, Any] = {"multiply": None if self.multiply is None else str(self.multiply),
                               "accumulate": str(self.accumulate), "flush_subnormals": bool(self.flush_subnormals)}
        if self.promote_every is not None:
            part = self.partial_accumulate
            out.update(promote_every=int(self.promote_every),
                       partial_accumulate=part if part is None or isinstance(part, float) else str(part))
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Numerics:
        """The inverse of :meth:`to_json`."""
        return cls(multiply=d["multiply"], accumulate=d["accumulate"],
                   flush_subnormals=bool(d.get("flush_subnormals", False)), promote_every=d.get("promote_every"),
                   partial_accumulate=d.get("partial_accumulate"))

    def source(self) -> str:
        """``gmm_ref.Numerics(...)`` as valid source."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.to_json().items())
        return f"gmm_ref.Numerics({args})"

    @property
    def u_partial(self) -> float:
        """The unit roundoff of the partial sums (``partial_accumulate``, else the accumulator's)."""
        part = self.partial_accumulate
        if part is None:
            return self.u_acc
        return part if isinstance(part, float) else _dt.unit_roundoff(part)

    @classmethod
    def default_for(cls, lhs_dtype: Any, rhs_dtype: Any, out_dtype: Any) -> Numerics:
        """The one default (docs/numerics.md): exact products, accumulation in the widest of
        float32, the inputs and the output (int32 for integers), subnormals possibly flushed."""
        dts = [np.dtype(lhs_dtype), np.dtype(rhs_dtype), np.dtype(out_dtype)]
        if all(_dt.is_integer(d) for d in dts):
            return cls(multiply=None, accumulate=np.int32, flush_subnormals=True)
        wide = np.float64 if np.dtype(np.float64) in dts else np.float32
        return cls(multiply=None, accumulate=wide, flush_subnormals=True)

    def u_in(self, *input_dtypes: Any) -> float:
        if self.multiply is None:
            return 0.0
        if all(_representable(np.dtype(d), self.multiply) for d in input_dtypes):
            return 0.0
        return _dt.unit_roundoff(self.multiply)

    @property
    def u_acc(self) -> float:
        return _dt.unit_roundoff(self.accumulate)

    def exact_limits(self, input_dtypes: tuple[Any, ...], out_dtype: Any) -> tuple[float, float]:
        """(largest |input|, largest |A||B|) for which integer inputs compute exactly."""
        def sig_limit(dtype: Any) -> float:
            dtype = np.dtype(dtype)
            if _dt.is_integer(dtype):
                return float(_dt.iinfo(dtype).max)
            return 2.0 ** (_dt.float_format(dtype).mant + 1)

        in_limit = min(sig_limit(d) for d in input_dtypes)
        if self.multiply is not None:
            in_limit = min(in_limit, sig_limit(self.multiply))
        sum_limit = min(sig_limit(self.accumulate), sig_limit(out_dtype))
        if self.partial_accumulate is not None:  # integers below 1 / u hold exactly in the partial sums
            sum_limit = min(sum_limit, 1.0 / self.u_partial)
        return in_limit, sum_limit


def default_numerics(p: Problem) -> Numerics:
    """The one default for ``p`` (:meth:`Numerics.default_for`); a scaled problem's default accumulates in
    float32 (float64 for a float64 output), as scaled kernels do, whatever the codes."""
    if p.scaled:
        wide = np.float64 if p.out_dtype == np.dtype(np.float64) else np.float32
        return Numerics(multiply=None, accumulate=wide, flush_subnormals=True)
    return Numerics.default_for(p.lhs.dtype, p.rhs.dtype, p.out_dtype)


def min_normal(dtype: Any) -> float:
    """The smallest positive normal number of a float dtype (0 for integers)."""
    dtype = np.dtype(dtype)
    return 0.0 if _dt.is_integer(dtype) else 2.0 ** _dt.float_format(dtype).emin


def error_bound(p: Problem, exact: np.ndarray, numerics: Numerics) -> np.ndarray:
    """Per-element bound on ``|kernel - exact|`` for a kernel with ``numerics`` (docs/numerics.md).

    ``exact`` is the problem's exact result (float64 or int64, the output's shape).
    """
    if not isinstance(numerics, Numerics):
        raise TypeError(f"numerics: expected gmm_ref.Numerics, got {type(numerics).__name__}")
    out = np.zeros(p.out_shape, np.float64)
    if _dt.is_integer(p.out_dtype):
        return out  # integer arithmetic is exact (modulo wrap-around)
    accumulate = p.existing_out is not None and p.existing_policy == "accumulate"
    for blk in blocks(p):
        if blk.k == 0 and not accumulate:
            continue
        existing = p.existing_out[blk.out_index] if accumulate else None
        out[blk.out_index] = _block_bound(p, blk.a, blk.b, existing, exact[blk.out_index], blk.k, numerics)
    return out


# Rows of a block's lhs whose bound is computed at once: bounds the float64 temporaries (about
# 32 MiB at this size) however large the block, so that huge problems stay within memory.
BOUND_CHUNK_ELEMENTS = 1 << 22


def _block_bound(p: Problem, a_in: np.ndarray, b_in: np.ndarray, existing: np.ndarray | None,
                 exact: np.ndarray, k: int, numerics: Numerics) -> np.ndarray:
    """The bound of one group's output block ``a_in @ b_in`` (+ ``existing`` when accumulated), row
    chunk by row chunk of ``a_in`` (each output row depends on its lhs row only)."""
    in_lim, sum_lim = numerics.exact_limits(p.value_dtypes, p.out_dtype)
    rows = max(1, BOUND_CHUNK_ELEMENTS // max(a_in.shape[1], 1))
    chunks = [slice(r, min(r + rows, a_in.shape[0])) for r in range(0, a_in.shape[0], rows)] or [slice(0, 0)]
    b = np.abs(b_in.astype(np.float64))
    # exact mode needs every operand integer-valued, over the whole block
    integer = _integer_valued(b, in_lim) and all(
        _integer_valued(np.abs(x[c].astype(np.float64)), in_lim)
        for c in chunks for x in ([a_in] if existing is None else [a_in, existing]))
    out = np.empty(exact.shape, np.float64)
    for c in chunks:
        out[c] = _chunk_bound(p, a_in[c], b_in, b, None if existing is None else existing[c], exact[c], k,
                              numerics, sum_lim if integer else None)
    return out


def _chunk_bound(p: Problem, a_in: np.ndarray, b_in: np.ndarray, b: np.ndarray, existing: np.ndarray | None,
                 exact: np.ndarray, k: int, numerics: Numerics, sum_lim: float | None) -> np.ndarray:
    """The bound of some rows of a block; ``sum_lim`` when every operand is integer-valued (exact mode)."""
    fmt = _dt.float_format(p.out_dtype)
    u_in = numerics.u_in(*p.value_dtypes)
    acc = numerics.accumulate
    tiny_acc = 0.0 if _dt.is_integer(acc) else _dt.float_format(acc).tiny
    a = np.abs(a_in.astype(np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        ab = a @ b
    if existing is not None:
        ex = np.abs(existing.astype(np.float64))
        ab = ab + ex
        k += 1
    # a scaled operand's scale multiplies a partial sum (after the K loop, or per K block) in the
    # accumulator: one more rounding on every term's path per scaled operand
    scales = (p.lhs_quant is not None) + (p.rhs_quant is not None)
    scales += (p.lhs_global is not None) + (p.rhs_global is not None)  # a second level: one more multiply each
    k += scales
    with np.errstate(invalid="ignore", over="ignore"):
        # inputs rounded to the multiply precision (twice u_in plus its square), then
        # k roundings in the accumulator (Higham's gamma_k covers products and sums),
        # products underflowing in it (k * its tiny), the reference's own float64
        # sums, and the one rounding to the output dtype of a value that far off.
        acc = 1 + gamma(k, numerics.u_acc)
        if numerics.promote_every is not None:
            # partial sums of at most L terms in their own precision, then per block the scales' product and
            # its product with the partial sum, and one sum over the blocks, in the accumulator
            span = min(max(k - scales, 1), numerics.promote_every)
            blocks = -(-max(k - scales, 1) // numerics.promote_every)
            acc = (1 + gamma(span, numerics.u_partial)) * (1 + gamma(blocks + 2, numerics.u_acc))
        rel = (1 + u_in) ** 2 * acc - 1 + gamma(k + 1, U_REF)
        err = rel * ab + k * tiny_acc
        if numerics.flush_subnormals:
            err = err + _flush_error(a_in, b_in, a, b, k, numerics)
        bnd = err + fmt.unit_roundoff * (np.abs(exact) + err) + fmt.tiny
        if numerics.flush_subnormals:
            bnd = bnd + min_normal(p.out_dtype)  # an output below it may become 0
    if sum_lim is not None:
        bnd = np.where(ab <= sum_lim, 0.0, bnd)
    return bnd


def _flush_error(a_in: np.ndarray, b_in: np.ndarray, a: np.ndarray, b: np.ndarray, k: int,
                 numerics: Numerics) -> np.ndarray:
    """Error a flush-to-zero kernel may add: flushed subnormal inputs, plus every product
    or partial sum below the accumulator's smallest normal."""
    def below(x: np.ndarray, dtype: Any) -> np.ndarray:
        lim = min_normal(dtype)
        if numerics.multiply is not None:
            lim = max(lim, min_normal(numerics.multiply))
        return np.where(x < lim, x, 0.0)

    with np.errstate(invalid="ignore", over="ignore"):
        flushed = below(a, a_in.dtype) @ b + a @ below(b, b_in.dtype)
    return flushed + (k + 1) * min_normal(numerics.accumulate)


def _integer_valued(x: np.ndarray, limit: float) -> bool:
    if x.size == 0:
        return True
    with np.errstate(invalid="ignore"):
        return bool(np.all(np.isfinite(x)) and np.all(x == np.rint(x)) and np.max(x) <= limit)


def parse_numerics(text: str | None, *, option: str = "--numerics") -> Numerics | None:
    """``"accumulate=float32,multiply=bfloat16,flush"`` -> ``Numerics``; ValueError naming ``option``.

    The text form of :class:`Numerics` that the command lines' ``--numerics`` take (the main job's, the plugin's
    ``--gmm-numerics``, ``python -m golden``'s); it lives with the record it spells, below every command line."""
    if text is None:
        return None
    fields: dict[str, Any] = {"multiply": None, "accumulate": "float32", "flush_subnormals": False}
    for item in (t.strip() for t in text.split(",") if t.strip()):
        key, eq, value = item.partition("=")
        if key in ("flush", "flush_subnormals") and (not eq or value in ("true", "1", "yes")):
            fields["flush_subnormals"] = True
        elif key in ("flush", "flush_subnormals") and value in ("false", "0", "no"):
            fields["flush_subnormals"] = False
        elif key in ("multiply", "accumulate") and eq:
            fields[key] = None if value in ("exact", "none") else value
        elif key == "promote_every" and eq and value.isdigit():
            fields[key] = int(value)
        elif key == "partial" and eq:
            fields["partial_accumulate"] = _roundoff(value)
        else:
            raise ValueError(f"{option}: expected accumulate=DTYPE, multiply=DTYPE|exact, flush[=true|false], "
                             f"promote_every=N and partial=DTYPE|2**-BITS separated by commas, got {item!r}")
    try:
        return Numerics(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{option}: {exc}") from None


def _roundoff(value: str) -> Any:
    """``partial=``'s value: ``2**-13`` (a unit roundoff), a float, or a dtype name."""
    text = value.replace("^", "**")
    if text.startswith("2**"):
        try:
            return 2.0 ** int(text[3:])
        except ValueError:
            return value
    try:
        return float(text)
    except ValueError:
        return value
