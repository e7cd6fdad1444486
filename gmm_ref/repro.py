"""Reproducers: Python source that rebuilds a problem exactly, and problems saved to ``.npz``.

A small problem (at most :data:`MAX_INLINE` elements in all its arrays, as a
shrunk failure usually is) is written out as literals; a larger one is saved
to an ``.npz`` named by its content hash in :func:`repro_directory` and the
source loads it (:func:`load_problem`), so a reproducer stays a few lines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from gmm_ref.numerics import Numerics
from gmm_ref.problem import Problem
from gmm_ref.scaled.model import Quantization

__all__ = ["MAX_INLINE", "fenced", "load_array", "load_problem", "numerics_source", "problem_source",
           "repro_directory", "reproducer", "save_problem"]

#: problems with at most this many elements in all their arrays are written out as literals
MAX_INLINE = 256
#: inputs larger than this (bytes) are not written beside a report (a problem past 2**31 elements
#: would take minutes and GiB to compress): the reproducer says how the check built them instead
MAX_SAVED_BYTES = 1 << 30

_META = "__problem__"
_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float4_e2m1fn", "int4")


def _dtype_named(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name)) if name in _ML_DTYPES else np.dtype(name)


# ------------------------------------------------------------------ .npz files
def _stored(a: np.ndarray) -> np.ndarray:
    """The array's exact bytes as unsigned ints (bfloat16 and float8 have no .npy type of their own)."""
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}") if a.dtype.kind == "f" or a.dtype.kind == "V" else a


def save_problem(problem: Problem, path: str | os.PathLike[str], **extra: np.ndarray) -> Path:
    """Write ``problem`` (and named ``extra`` arrays, e.g. a cotangent) to an ``.npz``, bit for bit."""
    if not isinstance(problem, Problem):
        raise TypeError(f"problem: expected a gmm_ref.Problem, got {type(problem).__name__}")
    arrays: dict[str, np.ndarray] = {}
    fields: dict[str, Any] = {}
    dtypes: dict[str, str] = {}
    for f in dataclasses.fields(problem):
        value = getattr(problem, f.name)
        if isinstance(value, np.ndarray):
            arrays[f.name], dtypes[f.name] = _stored(value), str(value.dtype)
        elif isinstance(value, Quantization):
            fields[f.name] = {"elem": str(value.elem), "scale": str(value.scale), "block": list(value.block),
                              "global_scale": value.global_scale}
        elif isinstance(value, np.dtype):
            fields[f.name] = str(value)
        else:
            fields[f.name] = list(value) if isinstance(value, tuple) else value
    for name, value in extra.items():
        if name in arrays or name == _META:
            raise ValueError(f"extra: {name!r} is taken by the problem's own fields")
        value = np.asarray(value)
        arrays[name], dtypes[name] = _stored(value), str(value.dtype)
    meta = json.dumps({"fields": fields, "dtypes": dtypes}, sort_keys=True)
    path = Path(path)
    buf = io.BytesIO()
    np.savez_compressed(buf, **{_META: np.array(meta)}, **arrays)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, path)
    return path


def _read(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    with np.load(Path(path), allow_pickle=False) as z:
        if _META not in z.files:
            raise ValueError(f"path: {os.fspath(path)!r} is not a problem saved by gmm_ref.save_problem")
        meta = json.loads(str(z[_META]))
        arrays = {k: z[k].view(_dtype_named(meta["dtypes"][k])) for k in z.files if k != _META}
    return meta, arrays


def load_problem(path: str | os.PathLike[str]) -> Problem:
    """The problem :func:`save_problem` wrote to ``path``."""
    meta, arrays = _read(path)
    fields = dict(meta["fields"])
    if fields.get("tiling") is not None:
        fields["tiling"] = tuple(fields["tiling"])
    for name in ("lhs_quant", "rhs_quant"):
        if fields.get(name) is not None:
            q = fields[name]
            fields[name] = Quantization(q["elem"], q["scale"], tuple(q["block"]), q.get("global_scale", False))
    names = {f.name for f in dataclasses.fields(Problem)}
    return Problem(**fields, **{k: v for k, v in arrays.items() if k in names})


def load_array(path: str | os.PathLike[str], name: str) -> np.ndarray:
    """An extra array (e.g. ``"cotangent"``) saved beside a problem by :func:`save_problem`."""
    _, arrays = _read(path)
    if name not in arrays:
        raise KeyError(f"name: {os.fspath(path)!r} holds no array {name!r} (it has {sorted(arrays)})")
    return arrays[name]


def repro_directory() -> Path:
    """Where reproducers keep their ``.npz`` files: ``$GMM_REPRO_DIR``, else ``.gmm-repro`` in the working
    directory (beside Hypothesis' ``.hypothesis``), else a temporary directory if that is not writable."""
    env = os.environ.get("GMM_REPRO_DIR")
    for candidate in ([Path(env)] if env else [Path.cwd() / ".gmm-repro", Path(tempfile.gettempdir()) / "gmm-repro"]):
        try:
            candidate.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(candidate, os.W_OK):
            return candidate.resolve()
    raise OSError(f"no writable directory for reproducer data (set GMM_REPRO_DIR); tried {candidate}")


# -------------------------------------------------------------------- source
def _dtype_expr(dtype: np.dtype) -> str:
    name = str(dtype)
    return f"ml_dtypes.{name}" if name in _ML_DTYPES else f"np.{name}"


def _array_expr(a: np.ndarray) -> str:
    if np.issubdtype(a.dtype, np.integer):
        vals = a.tolist()
    elif str(a.dtype) == "int4":
        vals = a.astype(np.int64).tolist()
    else:  # float() of any of our float dtypes is exact, and repr(float) round-trips
        vals = a.astype(np.float64).tolist()
    return f"np.array({vals!r}, dtype={_dtype_expr(a.dtype)}).reshape({a.shape})"


def _size(problem: Problem, extra: Mapping[str, np.ndarray]) -> int:
    arrays = [getattr(problem, f.name) for f in dataclasses.fields(problem)]
    return sum(a.size for a in [*arrays, *extra.values()] if isinstance(a, np.ndarray))


def problem_source(problem: Problem, *, extra: Mapping[str, np.ndarray] | None = None,
                   directory: str | os.PathLike[str] | None = None) -> tuple[list[str], list[str]]:
    """(import lines, lines binding ``problem`` and each ``extra`` name): literals for a small problem,
    else a load of the ``.npz`` written to ``directory`` (default :func:`repro_directory`)."""
    extra = {k: np.asarray(v) for k, v in (extra or {}).items()}
    if not isinstance(problem, Problem):  # a routing (gmm_ref.Routing): small once shrunk, written out whole
        return _literal(problem, extra)
    nbytes = sum(a.nbytes for a in [*(getattr(problem, f.name) for f in dataclasses.fields(problem)),
                                    *extra.values()] if isinstance(a, np.ndarray))
    if nbytes > MAX_SAVED_BYTES:
        # a builder may leave (imports, expression) that rebuilds the problem deterministically
        imports, built = getattr(problem, "_built_by", None) or ([], "None  # rebuild it as the check did")
        lines = [f"# the inputs ({nbytes / 2**30:.1f} GiB) are not saved beside the report; {problem.describe()}",
                 f"problem = {built}"]
        return ["import gmm_ref", *imports], lines + [f"{name} = None  # not saved" for name in extra]
    if _size(problem, extra) > MAX_INLINE:
        buf = io.BytesIO()
        np.savez(buf, *[getattr(problem, f.name) for f in dataclasses.fields(problem)
                        if isinstance(getattr(problem, f.name), np.ndarray)], *extra.values())
        digest = hashlib.sha256(buf.getvalue() + problem.describe().encode()).hexdigest()[:12]
        path = save_problem(problem, Path(directory or repro_directory()) / f"problem-{digest}.npz", **extra)
        lines = [f"DATA = {str(path)!r}  # written beside the report; bit-exact inputs",
                 "problem = gmm_ref.load_problem(DATA)"]
        lines += [f"{name} = gmm_ref.load_array(DATA, {name!r})" for name in extra]
        return ["import gmm_ref"], lines
    return _literal(problem, extra)


def _literal(problem: Any, extra: Mapping[str, np.ndarray]) -> tuple[list[str], list[str]]:
    """(imports, lines) binding ``problem`` (a ``gmm_ref.Problem`` or ``gmm_ref.Routing``) and ``extra`` as literals."""
    imports = ["import numpy as np", "import gmm_ref"]
    dtypes = [getattr(problem, f.name) for f in dataclasses.fields(problem)]
    dtypes = [d.dtype if isinstance(d, np.ndarray) else d for d in [*dtypes, *extra.values()]]
    if any(isinstance(d, np.dtype) and str(d) in _ML_DTYPES for d in dtypes):
        imports.insert(1, "import ml_dtypes")
    floats = [a for a in [*(getattr(problem, f.name) for f in dataclasses.fields(problem)), *extra.values()]
              if isinstance(a, np.ndarray) and (a.dtype.kind == "f" or str(a.dtype) in _ML_DTYPES)]
    nonfinite = any(not np.isfinite(a.astype(np.float64)).all() for a in floats)
    lines = ["nan, inf = np.nan, np.inf"] if nonfinite else []
    lines.append(f"problem = gmm_ref.{type(problem).__name__}(")
    for f in dataclasses.fields(problem):
        v = getattr(problem, f.name)
        if isinstance(v, np.ndarray):
            expr = _array_expr(v)
        elif isinstance(v, np.dtype):
            expr = _dtype_expr(v)
        else:
            if (v is None or (f.default is not dataclasses.MISSING and v == f.default)) and f.name != "group_sizes":
                continue
            expr = repr(v)
        lines.append(f"    {f.name}={expr},")
    lines.append(")")
    lines += [f"{name} = {_array_expr(value)}" for name, value in extra.items()]
    return imports, lines


def numerics_source(numerics: Any) -> str:
    """``gmm_ref.Numerics(...)`` (or a routed kernel's ``gmm_ref.RoutedNumerics(...)``) as source."""
    if isinstance(numerics, Numerics):
        return numerics.source()
    product = "None" if numerics.product is None else numerics.product.source()
    return (f"gmm_ref.RoutedNumerics(product={product}, weight={str(numerics.weight)!r}, "
            f"combine={str(numerics.combine)!r})")


def fenced(source: str) -> str:
    """``source`` in a fenced ``python`` block, as the reports print reproducers."""
    return f"```python\n{source}\n```"


def reproducer(p: Problem, *, numerics: Numerics | None = None,
               directory: str | os.PathLike[str] | None = None) -> str:
    """Source that rebuilds ``p`` and its reference; the kernel call and the check are left for you
    to fill in (a kernel checked through gmm_kernels gets a reproducer that calls it)."""
    imports, lines = problem_source(p, directory=directory)
    lines.append("ref = gmm_ref.reference(problem)  # .values, .mask, .bound(numerics)")
    if p.convention:
        lines.append(f"args, kwargs = gmm_ref.arguments(problem)  # {p.convention}'s arguments, as NumPy")
        lines.append("# out = your_kernel(*args, **kwargs)")
    else:
        lines.append("# out = your kernel's output for problem")
    numerics_arg = f", numerics={numerics_source(numerics)}" if numerics is not None else ""
    lines.append(f"# gmm_ref.assert_matches_reference(out, problem{numerics_arg})")
    return "\n".join([*imports, *lines])
