"""One tiny Triton kernel per interpreter defect (``gmm_kernels.runtimes.triton_interpreter.DEFECTS``), run in
Triton's interpreter whatever ``TRITON_INTERPRET`` says: each probe is True where the interpreter computes
what a GPU does. Imported only where Triton is (it imports ``triton`` and ``torch``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton.language as tl
from triton.runtime.errors import InterpreterError
from triton.runtime.interpreter import InterpretedFunction

__all__ = ["PROBES"]

_FAILED = (InterpreterError, AttributeError, TypeError, ValueError)


def _dot(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    idx = offs[:, None] * BLOCK + offs[None, :]
    c = tl.dot(tl.load(a_ptr + idx), tl.load(b_ptr + idx), out_dtype=tl.float32)
    tl.store(c_ptr + idx, c)


def _cast(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs).to(tl.bfloat16))


def _splat(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    live = tl.program_id(0) < n  # a scalar comparison, splatted into the block's mask
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=live, other=0.0), mask=live)


def _range(y_ptr, n):
    total = tl.zeros((1,), dtype=tl.int64)
    for i in tl.range(0, n):
        total += i.to(tl.int64)
    tl.store(y_ptr + tl.arange(0, 1), total)


def _upcast(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs).to(tl.float32))


def _mul(x_ptr, y_ptr, z_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(z_ptr + offs, tl.load(x_ptr + offs) * tl.load(y_ptr + offs))


def _wide(y_ptr, n, stride: tl.int64):
    tl.store(y_ptr + tl.arange(0, 1), n * stride + tl.zeros((1,), dtype=tl.int64))


def _interpreted(fn: Callable[..., None]) -> InterpretedFunction:
    return InterpretedFunction(fn)


def _probe_dot() -> bool:
    a = torch.full((16, 16), 1.5, dtype=torch.bfloat16)
    b = torch.full((16, 16), 2.0, dtype=torch.bfloat16)
    c = torch.empty((16, 16), dtype=torch.float32)
    _interpreted(_dot)[(1,)](a, b, c, BLOCK=16)
    return bool(torch.equal(c, torch.full((16, 16), 48.0)))


def _probe_cast() -> bool:
    x = torch.tensor([1 + 2**-8 + 2**-9, 1 + 2**-8, -(3 + 2**-6 + 2**-7), 2.0**-130], dtype=torch.float32)
    y = torch.empty(4, dtype=torch.bfloat16)
    _interpreted(_cast)[(1,)](x, y, BLOCK=4)
    return bool(torch.equal(y.view(torch.int16), x.to(torch.bfloat16).view(torch.int16)))  # torch rounds to even


def _probe_splat() -> bool:
    x = torch.arange(4, dtype=torch.float32)
    y = torch.zeros(4, dtype=torch.float32)
    try:
        _interpreted(_splat)[(1,)](x, y, 1, BLOCK=4)
    except _FAILED:
        return False
    return bool(torch.equal(x, y))


def _probe_range() -> bool:
    y = torch.zeros(1, dtype=torch.int64)
    try:
        _interpreted(_range)[(1,)](y, 4)
    except _FAILED:
        return False
    return int(y[0]) == 6


def _probe_fp8_nan() -> bool:
    a = torch.ones((16, 16), dtype=torch.float32)
    a[0, 3] = float("nan")
    b = torch.ones((16, 16), dtype=torch.float32)
    c = torch.zeros((16, 16), dtype=torch.float32)
    _interpreted(_dot)[(1,)](a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn), c, BLOCK=16)
    return bool(c[0].isnan().all()) and bool(torch.equal(c[1:], torch.full((15, 16), 16.0)))


def _probe_bf16_arith() -> bool:
    x = torch.tensor([1.5, -2.0, 3.0, 2.0**-3], dtype=torch.bfloat16)
    y = torch.tensor([2.0, 0.5, -1.25, 1 + 2**-7], dtype=torch.bfloat16)
    z = torch.empty(4, dtype=torch.bfloat16)
    _interpreted(_mul)[(1,)](x, y, z, BLOCK=4)
    return bool(torch.equal(z.view(torch.int16), (x * y).view(torch.int16)))  # torch rounds the product to even


def _probe_bf16_subnormal() -> bool:
    x = torch.tensor([2.755e-40, -1.0e-39, 1.5, 2.0**-130], dtype=torch.bfloat16)  # subnormal, subnormal, normal
    y = torch.empty(4, dtype=torch.float32)
    _interpreted(_upcast)[(1,)](x, y, BLOCK=4)
    return bool(torch.equal(y, x.float()))


def _probe_tf32() -> bool:
    a = torch.full((16, 16), 1 + 2**-20, dtype=torch.float32)  # 1 to a tensor core under TF32
    c = torch.zeros((16, 16), dtype=torch.float32)
    _interpreted(_dot)[(1,)](a, torch.ones((16, 16), dtype=torch.float32), c, BLOCK=16)
    return bool(torch.equal(c, torch.full((16, 16), 16.0)))


def _probe_int_annotation() -> bool:
    y = torch.zeros(1, dtype=torch.int64)
    _interpreted(_wide)[(1,)](y, 3, 2**30)  # n int32, stride annotated int64: a GPU's i64 product is 3 * 2**30
    return int(y[0]) == 3 * 2**30


#: defect name -> its probe (True: the interpreter computes what a GPU does)
PROBES: dict[str, Callable[[], bool]] = {
    "bf16_dot": _probe_dot, "bf16_cast": _probe_cast, "bool_splat": _probe_splat, "range_int": _probe_range,
    "fp8_nan_dot": _probe_fp8_nan, "bf16_arith": _probe_bf16_arith, "int_annotation": _probe_int_annotation,
    "tf32_dot": _probe_tf32, "bf16_subnormal": _probe_bf16_subnormal}


