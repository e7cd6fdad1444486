"""Reference quantizers with scales from each block's largest magnitude (amax): FP8 and int8 with float scales.

Kernels that quantize their high-precision inputs themselves pick a block's scale from its amax in one of a few
ways, and the rounding of every step matters for an exact check. :class:`AmaxQuantizer` names one such format:

- ``rule="amax/max"``: the scale is ``amax / max`` (the value one code step stands for: DeepGEMM's
  ``per_token_cast_to_fp8``, vLLM's ``per_token_group_quant_fp8`` and ``scaled_fp8_quant``, qwix); codes are
  ``x / scale`` (``codes="divide"``) or ``x * (1 / scale)`` (``codes="reciprocal"``, DeepGEMM);
- ``rule="max/amax"``: a multiplier ``max / amax`` (TransformerEngine's current scaling, torchao's float8
  ``amax_to_scale``); codes are ``x * multiplier`` and the stored scale its reciprocal.

Every step is rounded once: the scale (or multiplier) into ``arith``, the scaled elements into ``code_arith``
(float32 unless said: torchao divides in float64, qwix computes in the inputs' dtype); a multiplier is a float32,
the scale is stored in ``scale_dtype``; ``eps`` clamps amax from below; ``pow2`` rounds the scale (or
the multiplier) to a power of two (``"ceil"``: vLLM's and DeepGEMM's UE8M0; ``"floor"``: TE's and torchao's
power-of-two scales, applied to the multiplier); a scale below ``min_scale`` (or an amax of 0 where nothing
clamps it) becomes ``zero_scale``. Codes saturate to the element's largest value and round to nearest even.
``across_groups=True`` takes each block's amax over every group at once (one scale shared by the groups, as
qwix's ``ragged_dot_qt`` does for the weights' channels) instead of restarting at every group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from gmm_ref import dtypes as _dt
from gmm_ref.scaled.model import ELEMENT_DTYPES, SCALE_DTYPES, Quantization, named_dtype

__all__ = ["AmaxQuantizer", "quantizer_from_json", "quantizer_to_json"]

RULES = ("amax/max", "max/amax")
CODE_RULES = ("divide", "reciprocal", "multiply")
POW2 = (None, "ceil", "floor")
_ARITH = tuple(np.dtype(d) for d in (np.float64, np.float32, ml_dtypes.bfloat16, np.float16))


def _round(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``x`` (float64) rounded once into ``dtype``, back as float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _dt.round_to(np.asarray(x, np.float64), dtype).astype(np.float64)


def _pow2(x: np.ndarray, mode: str) -> np.ndarray:
    """Positive finite ``x`` rounded to a power of two, up (``ceil``) or down (``floor``), exactly."""
    m, e = np.frexp(x)  # x = m * 2**e, 0.5 <= m < 1
    up = np.where(m == 0.5, e - 1, e)
    return np.ldexp(1.0, np.where(mode == "ceil", up, e - 1)) if x.size else x


@dataclass(frozen=True)
class AmaxQuantizer:
    """An amax-scaled format (see the module docstring): its element dtype, the block one scale covers (a
    :class:`gmm_ref.Quantization` block in the operand's ``[rows, K]`` view) and how the scale is computed."""

    elem: Any = ml_dtypes.float8_e4m3fn
    block: Any = "row"
    scale_dtype: Any = np.float32
    rule: str = "amax/max"
    codes: str = "divide"
    #: the precision the scale (or multiplier) is computed in, and the one the scaled elements are
    arith: Any = np.float32
    code_arith: Any = np.float32
    eps: float = 0.0
    pow2: str | None = None
    min_scale: float = 0.0
    zero_scale: float = 1.0
    across_groups: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "elem", named_dtype(self.elem, (*ELEMENT_DTYPES[:2], np.dtype(np.int8)), "elem"))
        object.__setattr__(self, "scale_dtype", named_dtype(self.scale_dtype, SCALE_DTYPES[:2], "scale_dtype"))
        object.__setattr__(self, "arith", named_dtype(self.arith, _ARITH, "arith"))
        object.__setattr__(self, "code_arith", named_dtype(self.code_arith, _ARITH, "code_arith"))
        Quantization(self.elem, self.scale_dtype, self.block)  # the block is checked there
        for name, value, allowed in (("rule", self.rule, RULES), ("codes", self.codes, CODE_RULES),
                                     ("pow2", self.pow2, POW2)):
            if value not in allowed:
                raise ValueError(f"{name}: expected one of {allowed}, got {value!r}")
        if (self.rule == "max/amax") != (self.codes == "multiply"):
            raise ValueError(f"codes: rule={self.rule!r} takes codes='multiply' " if self.rule == "max/amax" else
                             f"codes: codes='multiply' goes with rule='max/amax', got rule={self.rule!r}")
        for name in ("eps", "min_scale", "zero_scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name}: expected a finite non-negative number, got {v!r}")
        if not isinstance(self.across_groups, bool):
            raise TypeError(f"across_groups: expected a bool, got {self.across_groups!r}")

    @property
    def quantization(self) -> Quantization:
        """The :class:`Quantization` of the codes and scales it makes."""
        return Quantization(self.elem, self.scale_dtype, self.block)

    @property
    def top(self) -> float:
        """The element's largest value (``max`` in the rules)."""
        return float(_dt.iinfo(self.elem).max) if _dt.is_integer(self.elem) else float(ml_dtypes.finfo(self.elem).max)

    def scales(self, amax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the stored scales, what multiplies x to give codes) for blocks of largest magnitude ``amax``."""
        a = np.maximum(np.asarray(amax, np.float64), float(self.eps))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            if self.rule == "amax/max":
                s = _round(a / self.top, self.arith)
                if self.pow2:
                    s = np.where((s > 0) & np.isfinite(s), _pow2(np.where(s > 0, s, 1.0), self.pow2), s)
                s = _round(s, self.scale_dtype)
                s = np.where((s <= 0) | (s < self.min_scale) | ~np.isfinite(a), self.zero_scale, s)
                mult = _round(1.0 / s, self.code_arith) if self.codes == "reciprocal" else None
                return s, (mult if mult is not None else 1.0 / s)
            mult = _round(_round(self.top / a, self.arith), np.dtype(np.float32))  # a float32 multiplier
            mult = np.where((a <= 0) | ~np.isfinite(a), 1.0, mult)
            mult = np.where(np.isinf(mult), float(np.finfo(np.float32).max), mult)
            if self.pow2:
                mult = _pow2(mult, self.pow2)
            return _round(_round(1.0 / mult, np.dtype(np.float32)), self.scale_dtype), mult

    def codes_of(self, x: np.ndarray, scale: np.ndarray, mult: np.ndarray) -> np.ndarray:
        """``x`` (float64, its elements' own scales broadcast) as codes."""
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            y = _round(x / scale if self.codes == "divide" else x * mult, self.code_arith)
        if _dt.is_integer(self.elem):
            return np.clip(np.rint(y), -self.top, self.top).astype(self.elem)
        return _dt.round_to(np.clip(y, -self.top, self.top), self.elem)

    def quantize(self, x: Any, amax: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``x`` (``[rows, K]``) -> (codes, scales of ``quantization.scale_shape(rows, K)``); ``amax`` overrides
        the blocks' largest magnitudes (shared across groups)."""
        xf = np.asarray(x, np.float64)
        rows, k = xf.shape
        q = self.quantization
        if amax is None:
            amax = self.block_amax(xf)
        scale, mult = self.scales(amax)
        full_s = q.expand(scale, rows, k)
        full_m = q.expand(np.broadcast_to(mult, np.shape(scale)), rows, k)
        return self.codes_of(xf, full_s, full_m), scale.astype(self.scale_dtype)

    def block_amax(self, x: np.ndarray) -> np.ndarray:
        """Each block's largest magnitude (NaN where the block holds one)."""
        rows, k = x.shape
        br, bk = self.quantization.block
        br, bk = br or max(rows, 1), bk or max(k, 1)
        pr, pk = -(-rows // br) * br, -(-k // bk) * bk
        pad = np.zeros((pr, pk))
        pad[:rows, :k] = np.abs(x)
        blocks = pad.reshape(pr // br, br, pk // bk, bk)
        return np.max(blocks, axis=(1, 3)) if blocks.size else np.zeros((pr // br, pk // bk))

    def describe(self) -> str:
        """Short: ``float8_e4m3fn/bfloat16@row amax/max`` (and ``across groups``)."""
        return (f"{self.quantization.describe()} {self.rule}" + (f" pow2 {self.pow2}" if self.pow2 else "")
                + (" across groups" if self.across_groups else ""))

    def __repr__(self) -> str:  # valid source, as reproducers print it
        fields = ", ".join(f"{f}={getattr(self, f)!r}" if not isinstance(getattr(self, f), np.dtype)
                           else f"{f}={str(getattr(self, f))!r}" for f in self.__dataclass_fields__)
        return f"gmm_ref.AmaxQuantizer({fields})"


def quantizer_to_json(q: Any) -> dict[str, Any]:
    """A declared quantizer (:class:`AmaxQuantizer` or ``gmm_ref.MXQuantizer``) as JSON."""
    if isinstance(q, AmaxQuantizer):
        d = {f: getattr(q, f) for f in q.__dataclass_fields__}
        d = {k: str(v) if isinstance(v, np.dtype) else list(v) if isinstance(v, tuple) else v for k, v in d.items()}
        return {"kind": "amax", **d}
    return {"elem": str(q.elem), "block_size": q.block_size, "scale_mode": q.scale_mode}


def quantizer_from_json(d: dict[str, Any]) -> Any:
    """The inverse of :func:`quantizer_to_json`."""
    from gmm_ref.scaled.model import MXQuantizer

    d = dict(d)
    if d.pop("kind", "mx") == "amax":
        if isinstance(d.get("block"), list):
            d["block"] = tuple(d["block"])
        return AmaxQuantizer(**d)
    return MXQuantizer(**d)
