"""Dtypes the reference understands, their unit roundoffs, and one correct rounding.

The reference computes in float64 (int64 for integer inputs) and rounds *once*
to the output dtype. ``ml_dtypes``' ``astype`` from float64 to bfloat16 or the
float8 formats goes through float32 and so rounds twice; :func:`round_to`
does a single round-to-nearest-even at the target precision instead.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "CODE_ONLY_DTYPES",
    "INPUT_DTYPES",
    "OUTPUT_DTYPES",
    "FloatFormat",
    "as_dtype",
    "as_numpy",
    "float_format",
    "iinfo",
    "is_integer",
    "round_to",
    "standin_codes",
    "unit_roundoff",
]


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format: ``mant`` fraction bits, normal exponents ``[emin, emax]``."""

    name: str
    mant: int
    emin: int
    emax: int
    max_finite: float
    has_inf: bool

    @property
    def unit_roundoff(self) -> float:
        return 2.0 ** -(self.mant + 1)

    @property
    def tiny(self) -> float:
        """The smallest positive subnormal."""
        return 2.0 ** (self.emin - self.mant)

    @property
    def overflow_threshold(self) -> float:
        """Values of magnitude at or past this round to infinity (or NaN)."""
        return self.max_finite + 2.0 ** (self.emax - self.mant - 1)


def _fmt(name: str, dtype: Any, has_inf: bool = True) -> FloatFormat:
    info = ml_dtypes.finfo(dtype)
    return FloatFormat(
        name=name,
        mant=int(info.nmant),
        emin=int(info.minexp),
        emax=int(info.maxexp) - 1,
        max_finite=float(info.max),
        has_inf=has_inf,
    )


_FORMATS: dict[np.dtype, FloatFormat] = {
    np.dtype(np.float64): _fmt("float64", np.float64),
    np.dtype(np.float32): _fmt("float32", np.float32),
    np.dtype(np.float16): _fmt("float16", np.float16),
    np.dtype(ml_dtypes.bfloat16): _fmt("bfloat16", ml_dtypes.bfloat16),
    np.dtype(ml_dtypes.float8_e4m3fn): _fmt(
        "float8_e4m3fn", ml_dtypes.float8_e4m3fn, has_inf=False
    ),
    np.dtype(ml_dtypes.float8_e5m2): _fmt("float8_e5m2", ml_dtypes.float8_e5m2),
}

#: formats only quantized codes use (gmm_ref.scaled.model): round_to reaches them, problems do not take them
_CODE_FORMATS: dict[np.dtype, FloatFormat] = {
    np.dtype(ml_dtypes.float4_e2m1fn): _fmt("float4_e2m1fn", ml_dtypes.float4_e2m1fn, has_inf=False),
}

INPUT_DTYPES: tuple[np.dtype, ...] = (*tuple(_FORMATS), np.dtype(np.int8))
OUTPUT_DTYPES: tuple[np.dtype, ...] = (*tuple(_FORMATS), np.dtype(np.int32))

#: element dtypes only scaled operands (codes with scales) take: a convention's dtype pairs may name them
CODE_ONLY_DTYPES: tuple[np.dtype, ...] = (np.dtype(ml_dtypes.float4_e2m1fn), np.dtype(ml_dtypes.int4))

_NAMES = {str(d): d for d in INPUT_DTYPES + OUTPUT_DTYPES}


def as_dtype(value: Any, *, name: str = "dtype", codes: bool = False) -> np.dtype:
    """Normalise a dtype-like (NumPy, ml_dtypes, jax or torch dtype, or its name); ``codes``: the element
    dtypes of scaled operands (:data:`CODE_ONLY_DTYPES`) are taken too."""
    if value is None:
        raise TypeError(f"{name}: expected a dtype, got None")
    text = str(value)
    if text.startswith("torch."):
        text = text[len("torch."):]
    if text in _NAMES:
        return _NAMES[text]
    if codes and text in {str(d) for d in CODE_ONLY_DTYPES}:
        return np.dtype(getattr(ml_dtypes, text))
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise TypeError(
            f"{name}: expected one of {sorted(_NAMES)}, got {value!r}"
        ) from None
    if dtype not in OUTPUT_DTYPES and dtype not in INPUT_DTYPES and not (codes and dtype in CODE_ONLY_DTYPES):
        raise TypeError(f"{name}: unsupported dtype {dtype}; expected one of {sorted(_NAMES)}")
    return dtype


def as_numpy(value: Any, *, name: str = "actual", strict: bool = False) -> np.ndarray:
    """An array-like (NumPy, jax array, torch tensor on any device) as NumPy, bfloat16 bit-exact.

    torch is imported only for torch tensors; a torch bfloat16 tensor travels as
    its int16 bits, since NumPy has no bfloat16 of its own. A subclass of
    ``numpy.ndarray`` or ``torch.Tensor`` is read through its memory, never
    through its own methods, so what is judged is what the buffer holds.
    ``strict`` (a kernel's output): anything but a ``numpy.ndarray``, a
    ``torch.Tensor`` with storage of its own or a jax array is a ``TypeError``
    naming ``name`` and the type given, where otherwise ``numpy.asarray`` reads it.
    """
    if isinstance(value, np.ndarray):
        # a subclass's own __array__ / __getitem__ never run: the base class's view of the same memory
        return value if type(value) is np.ndarray else np.ndarray.view(value, np.ndarray)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return _torch_numpy(torch, value, name)
    if strict and not _is_jax_array(value):
        kind = type(value)
        raise TypeError(f"{name}: expected a numpy.ndarray, torch.Tensor or jax.Array, got {kind.__qualname__} "
                        f"(from {kind.__module__}); a kernel's output is judged by the array it returns, not by an "
                        "object that converts itself")
    try:
        return np.asarray(value)
    except Exception as exc:
        raise TypeError(f"{name}: cannot convert {type(value).__name__} to a NumPy array") from exc


def _is_jax_array(value: Any) -> bool:
    """Whether ``value`` is exactly jax's array type (jax.Array is an ABC that any class may register with)."""
    jax = sys.modules.get("jax")
    kind = type(value)
    return jax is not None and kind.__module__.startswith("jaxlib") and isinstance(value, jax.Array)


def _torch_numpy(torch: Any, value: Any, name: str) -> np.ndarray:
    """A torch tensor's bytes as NumPy. A subclass is read as the plain tensor over the same storage, its
    ``__torch_function__`` off; one that dispatches its own operations (a wrapper subclass) has no storage of
    its own to read and is refused by name."""
    kind = type(value)
    if kind is not torch.Tensor and kind is not torch.nn.Parameter:
        if getattr(kind, "__torch_dispatch__", None) is not getattr(torch.Tensor, "__torch_dispatch__", None):
            raise TypeError(f"{name}: a {kind.__qualname__} (from {kind.__module__}), a torch.Tensor subclass with "
                            "its own __torch_dispatch__: it has no storage of its own to judge; return a plain "
                            "torch.Tensor")
        with torch._C.DisableTorchFunctionSubclass():
            value = torch.Tensor.as_subclass(value, torch.Tensor)
    with torch._C.DisableTorchFunctionSubclass():
        t = value.detach().cpu()
        if t.dtype == torch.bfloat16:
            return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        byte_dtype = getattr(ml_dtypes, str(t.dtype).removeprefix("torch."), None) if t.element_size() == 1 else None
        if byte_dtype is not None:  # float8 codes and scales: their bytes
            return t.contiguous().view(torch.uint8).numpy().view(byte_dtype)
        return t.numpy()


#: ml_dtypes' sub-byte integers, which NumPy does not see as integers (their kind is "V")
_SUB_BYTE_INTS = tuple(np.dtype(getattr(ml_dtypes, n)) for n in ("int4", "uint4", "int2", "uint2")
                       if hasattr(ml_dtypes, n))


def is_integer(dtype: np.dtype) -> bool:
    """Whether ``dtype`` is an integer type, ml_dtypes' int4 / uint4 / int2 / uint2 included."""
    return np.issubdtype(dtype, np.integer) or np.dtype(dtype) in _SUB_BYTE_INTS


def standin_codes(codes: np.ndarray) -> np.ndarray:
    """Codes of a code-only dtype (:data:`CODE_ONLY_DTYPES`) as the input dtype holding the same values exactly
    (int4 as int8, float4_e2m1fn as float8_e4m3fn), so that an unscaled problem can be built from them before
    its scales are known; other arrays as they are."""
    if codes.dtype == np.dtype(ml_dtypes.int4):
        return codes.astype(np.int8)
    if codes.dtype == np.dtype(ml_dtypes.float4_e2m1fn):
        return codes.astype(ml_dtypes.float8_e4m3fn)
    return codes


def iinfo(dtype: Any) -> Any:
    """``np.iinfo`` that also knows ml_dtypes' sub-byte integers."""
    dtype = np.dtype(dtype)
    return ml_dtypes.iinfo(dtype) if dtype in _SUB_BYTE_INTS else np.iinfo(dtype)


def float_format(dtype: np.dtype) -> FloatFormat:
    try:
        dtype = np.dtype(dtype)
        return _FORMATS[dtype] if dtype in _FORMATS else _CODE_FORMATS[dtype]
    except KeyError:
        raise TypeError(f"no floating-point format for dtype {dtype}") from None


def unit_roundoff(dtype: Any) -> float:
    """Unit roundoff ``2**-(p)`` of a float dtype; 0 for integers (exact)."""
    dtype = np.dtype(dtype)
    if is_integer(dtype):
        return 0.0
    return float_format(dtype).unit_roundoff


def round_to(x: np.ndarray, dtype: Any) -> np.ndarray:
    """Round float64 ``x`` once, to nearest even, into ``dtype``.

    Integer targets wrap modulo 2**bits as integer accumulators do.
    """
    dtype = np.dtype(dtype)
    x = np.asarray(x)
    if is_integer(dtype):
        if not is_integer(x.dtype):
            raise TypeError(f"cannot round {x.dtype} values to integer dtype {dtype}")
        return x.astype(dtype)
    x = x.astype(np.float64, copy=False)
    if dtype in (np.dtype(np.float64), np.dtype(np.float32), np.dtype(np.float16)):
        with np.errstate(over="ignore"):  # overflow to inf is the correct rounding
            return x.astype(dtype)  # NumPy's casts from float64 round once
    fmt = float_format(dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        rounded = _round_bits(x, fmt)
        overflow = np.abs(rounded) > fmt.max_finite
        if fmt.has_inf:
            rounded = np.where(overflow, np.copysign(np.inf, x), rounded)
        else:
            rounded = np.where(overflow | np.isinf(x), np.nan, rounded)
    # every value is now exactly representable, so the double cast is exact
    return rounded.astype(dtype)


def _round_quantum(x: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """Float64 ``x`` rounded to nearest even on ``fmt``'s grid (subnormals included), range not yet applied."""
    _, e = np.frexp(x)  # x = f * 2**e with 0.5 <= |f| < 1
    exponent = np.maximum(e - 1, fmt.emin)
    quantum = np.ldexp(1.0, exponent - fmt.mant)
    return np.round(x / quantum) * quantum


def _round_bits(x: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """:func:`_round_quantum`, a few times faster: values in ``fmt``'s normal range round on their float64 bits
    (to nearest even at ``fmt.mant`` fraction bits, a carry moving into the exponent as it should); the rest
    (subnormal in ``fmt``, zero, Inf, NaN) take the quantum path."""
    x = np.ascontiguousarray(x, np.float64)
    drop = np.uint64(52 - fmt.mant)
    bits = x.view(np.uint64)
    half = (np.uint64(1) << (drop - np.uint64(1))) - np.uint64(1)
    bits = bits + (half + ((bits >> drop) & np.uint64(1)))
    bits &= ~((np.uint64(1) << drop) - np.uint64(1))
    rounded = bits.view(np.float64).reshape(x.shape)
    rest = ~(np.abs(x) >= 2.0 ** fmt.emin) | np.isinf(x)  # NaN compares False: it is in the rest
    if rest.any():
        rounded[rest] = _round_quantum(x[rest], fmt)
    return rounded
