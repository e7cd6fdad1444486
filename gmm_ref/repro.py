"""Copy-paste reproducers: Python source that rebuilds a problem exactly."""

from __future__ import annotations

import base64
import dataclasses
import zlib

import numpy as np

from gmm_ref.problem import Problem

__all__ = ["reproducer"]

MAX_INLINE = 4096  # elements per array written out in full


def _dtype_expr(dtype: np.dtype) -> str:
    name = str(dtype)
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        return f"ml_dtypes.{name}"
    return f"np.{name}"


MAX_ENCODED = 1 << 22  # larger arrays are not written out at all


def _array_expr(a: np.ndarray) -> str:
    if a.size > MAX_ENCODED:
        return (f"np.zeros({a.shape}, {_dtype_expr(a.dtype)})  "
                f"# {a.size} values not inlined; rebuild from the Hypothesis blob")
    if a.size > MAX_INLINE:  # exact bytes, compressed
        data = base64.b64encode(zlib.compress(np.ascontiguousarray(a).tobytes(), 6)).decode()
        return (f"np.frombuffer(zlib.decompress(base64.b64decode({data!r})), "
                f"dtype={_dtype_expr(a.dtype)}).reshape({a.shape}).copy()")
    if np.issubdtype(a.dtype, np.integer):
        vals = a.tolist()
    else:  # float() of any of our float dtypes is exact, and repr(float) round-trips
        vals = a.astype(np.float64).tolist()
    return f"np.array({vals!r}, dtype={_dtype_expr(a.dtype)}).reshape({a.shape})"


def reproducer(p: Problem) -> str:
    """Source of a snippet that rebuilds ``p`` and prints its reference."""
    lines = ["import base64, zlib", "import numpy as np, ml_dtypes", "import gmm_ref", "from gmm_ref import Problem",
             "nan, inf = np.nan, np.inf", "problem = Problem("]
    for f in dataclasses.fields(p):
        v = getattr(p, f.name)
        default = f.default
        if isinstance(v, np.ndarray):
            expr = _array_expr(v)
        elif isinstance(v, np.dtype):
            expr = _dtype_expr(v)
        else:
            is_default = v is None or (default is not dataclasses.MISSING and v == default)
            if is_default and f.name != "group_sizes":
                continue
            expr = repr(v)
        lines.append(f"    {f.name}={expr},")
    lines.append(")")
    lines.append("args, kwargs = gmm_ref.arguments(problem)  # the kernel's own arguments"
                 if p.convention else "")
    lines.append("ref = gmm_ref.reference(problem)  # .values, .mask, .bound(numerics)")
    return "\n".join(line for line in lines if line)
