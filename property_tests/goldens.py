"""Golden outputs for grouped-GEMM kernels: cases, storage, regeneration, verification, checks.

A *case* (:class:`Case`) is a small JSON-able spec: convention, family,
extents, group sizes, layouts, dtypes, policies and a seed. Its inputs are
recomputed from the spec, bit for bit on any machine, by :func:`values`
(a documented counter-based generator, below), so golden files need hold only
the outputs. A golden directory holds one ``<case>-<sha10>.npz`` per case
(``out`` and ``mask``, plus ``out_dtype``; inputs only with ``store_inputs``)
and ``manifest.json`` with, per case, the spec, the inputs' sha256, the
file's and the output's sha256, the producer (``reference`` or a kernel's
name, version and platform) and the dtypes.

Writes are crash-safe: each file goes to a temporary name, then
``os.replace``; file names carry their content hash, so a new golden never
overwrites one the current manifest names; the manifest is replaced last,
atomically, and only then are unreferenced files removed. An interrupted run
leaves the previous set intact.

Entry points: :func:`regenerate`, :func:`verify`, :func:`check_kernels`
(every available kernel against the goldens of its convention: pass, fail with
a one-line cause, or unsupported with the reason) and :func:`main`, the
command line behind ``python -m golden`` (this repository) and
``python -m property_tests.goldens --dir PATH`` (any repository).

Input generator (``splitmix64-v1``), in NumPy ``uint64`` wrapping arithmetic::

    mix(z)   = z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27;
               z *= 0x94D049BB133111EB; z ^ (z >> 31)        # SplitMix64's finalizer
    key      = mix(seed * GAMMA + fnv1a64(operand_name))      # GAMMA = 0x9E3779B97F4A7C15
    bits[i]  = mix(key + (i + 1) * GAMMA)                     # i = flat row-major index

(``bits`` is the i-th output of SplitMix64 started at state ``key``). Values:
``"uniform"``: ``u = (bits >> 11) * 2**-53`` in [0, 1), value ``scale * (2u - 1)``
rounded once to nearest even into the operand dtype (:func:`gmm_ref.round_to`);
``"int"``: ``(bits >> 11) % (2r + 1) - r`` for ``r = int_range`` (exact mode
when sums stay small). ``poison=True`` then sets every input element that no
group reads to NaN (0x7F... for int8 is not possible: int cases cannot poison).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import hashlib
import io
import json
import os
import platform as _platform
import sys
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import gmm_ref
from gmm_ref.compare import as_numpy
from gmm_ref import dtypes as _dt

__all__ = [
    "Case",
    "GoldenError",
    "GoldenResult",
    "GoldenStore",
    "build_problem",
    "check_kernel",
    "check_kernels",
    "main",
    "regenerate",
    "values",
    "verify",
]

FORMAT = 1
GENERATOR = "splitmix64-v1"
MANIFEST = "manifest.json"
GAMMA = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_U64 = np.uint64


class GoldenError(Exception):
    """A golden set is corrupt, inconsistent or would change without ``--update``."""


# --------------------------------------------------------------------------- generator
def _mix(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, dtype=_U64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> _U64(30))) * _U64(_M1)
        z = (z ^ (z >> _U64(27))) * _U64(_M2)
    return z ^ (z >> _U64(31))


def _fnv1a64(text: str) -> int:
    h = 0xCBF29CE484222325
    for byte in text.encode("utf-8"):
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def splitmix64(state: int, count: int) -> np.ndarray:
    """The first ``count`` outputs of SplitMix64 started at ``state`` (uint64)."""
    i = np.arange(1, count + 1, dtype=_U64)
    with np.errstate(over="ignore"):
        return _mix(_U64(state & 0xFFFFFFFFFFFFFFFF) + i * _U64(GAMMA))


def raw_bits(seed: int, name: str, count: int) -> np.ndarray:
    """Counter-based uint64 stream for ``(seed, name)``: element i depends only on (seed, name, i)."""
    key = int(_mix(np.array((seed * GAMMA + _fnv1a64(name)) & 0xFFFFFFFFFFFFFFFF, dtype=_U64)))
    return splitmix64(key, count)


def values(seed: int, name: str, shape: Sequence[int], dtype: Any, *, kind: str = "uniform",
           int_range: int = 3, scale: float = 1.0) -> np.ndarray:
    """Operand ``name`` of a case: deterministic values of ``dtype`` (see the module docstring)."""
    dtype = _dt.as_dtype(dtype, name="dtype")
    count = int(np.prod(shape, dtype=np.int64))
    top = raw_bits(seed, name, count) >> _U64(11)  # 53 random bits
    if kind == "int":
        if int_range < 0:
            raise ValueError(f"int_range: expected >= 0, got {int_range}")
        v = (top % _U64(2 * int_range + 1)).astype(np.int64) - int_range
        if _dt.is_integer(dtype):
            return v.astype(dtype).reshape(shape)
        return _dt.round_to(v.astype(np.float64), dtype).reshape(shape)
    if kind != "uniform":
        raise ValueError(f"kind: expected 'uniform' or 'int', got {kind!r}")
    if _dt.is_integer(dtype):
        raise ValueError(f"kind: 'uniform' needs a float dtype, got {dtype}; use kind='int'")
    u = top.astype(np.float64) * 2.0 ** -53
    return _dt.round_to(scale * (2.0 * u - 1.0), dtype).reshape(shape)


# --------------------------------------------------------------------------------- case
@dataclass(frozen=True)
class Case:
    """One golden case: everything needed to rebuild its problem (JSON-able).

    ``m``, ``k``, ``n`` are the logical extents (the ragged one includes any
    padded tail); ``group_sizes`` is ``[G]`` or ``[b..., G]`` (None for the
    ``batch`` family, which takes ``groups``). ``existing`` asks for an
    existing output (its policy is the convention's). The convention's own
    front-end (``gmm_ref.problem_from_arguments``) fixes the tail, foreign and
    empty-group policies, so a golden says exactly what that API promises.
    """

    name: str
    convention: str
    family: str
    m: int
    k: int
    n: int
    group_sizes: Any = None
    groups: int | None = None
    batch_shape: tuple[int, ...] = ()
    dtype: str = "float32"
    out_dtype: str | None = None
    lhs_transposed: bool = False
    rhs_transposed: bool = False
    packed: bool = False
    existing: bool = False
    group_offset: int = 0
    num_local_groups: int | None = None
    tiling: tuple[int, int, int] | None = None
    kind: str = "uniform"
    int_range: int = 3
    poison: bool = False
    seed: int = 0
    tags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        ok = set("abcdefghijklmnopqrstuvwxyz0123456789._-")
        if not self.name or set(self.name) - ok:
            raise ValueError(f"name: expected lowercase letters, digits, '.', '_' or '-', got {self.name!r}")
        gs = self.group_sizes
        if gs is not None:
            object.__setattr__(self, "group_sizes", np.asarray(gs, dtype=np.int64).tolist())
        object.__setattr__(self, "batch_shape", tuple(int(b) for b in self.batch_shape))
        object.__setattr__(self, "tags", tuple(self.tags))
        if self.tiling is not None:
            object.__setattr__(self, "tiling", tuple(int(t) for t in self.tiling))

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["batch_shape"] = list(self.batch_shape)
        d["tags"] = list(self.tags)
        if self.tiling is not None:
            d["tiling"] = list(self.tiling)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Case:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise GoldenError(f"case spec: unknown fields {sorted(unknown)}")
        d = dict(d)
        d["batch_shape"] = tuple(d.get("batch_shape", ()))
        d["tags"] = tuple(d.get("tags", ()))
        if d.get("tiling") is not None:
            d["tiling"] = tuple(d["tiling"])
        return cls(**d)

    @property
    def spec_key(self) -> str:
        """Canonical JSON of the spec (what a golden is keyed on)."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))


def _shapes(c: Case, local: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    b, m, k, n = c.batch_shape, c.m, c.k, c.n
    lt = (k, m) if c.lhs_transposed else (m, k)
    rt = (n, k) if c.rhs_transposed else (k, n)
    if c.family == "ragged_m":
        return (*b, *lt), (local, *b, *rt)
    if c.family == "ragged_n":
        return (local, *b, *lt), (*b, *rt)
    if c.family == "ragged_k":
        return (*b, *lt), (*b, *rt)
    if c.family == "batch":
        g = int(c.groups or 0)
        return (g, *b, *lt), (g, *b, *rt)
    raise ValueError(f"family: expected one of {gmm_ref.FAMILIES}, got {c.family!r}")


def _touched(p: gmm_ref.Problem, which: str) -> np.ndarray:
    """Which elements of operand ``which`` some group of ``p`` reads."""
    from gmm_ref.layouts import blocks

    arr = getattr(p, which)
    index = np.arange(arr.size, dtype=np.float64).reshape(arr.shape)
    probe = p.replace(**{which: index}, existing_out=None, out_dtype=None)
    seen = np.zeros(arr.size, bool)
    for blk in blocks(probe):
        seen[(blk.a if which == "lhs" else blk.b).astype(np.int64).ravel()] = True
    return seen.reshape(arr.shape)


# What each convention's API promises (its gmm_ref front-end must agree; checked in build_problem).
POLICIES: dict[str, dict[str, str]] = {
    "ragged_dot": {"tail": "zero", "foreign": "zero", "empty": "zero", "existing_policy": "overwrite"},
    "ragged_dot_general": {"tail": "zero", "foreign": "zero", "empty": "zero", "existing_policy": "overwrite"},
    "megablox.gmm": {"tail": "undefined", "foreign": "zero", "empty": "zero", "existing_policy": "overwrite"},
    "megablox.tgmm": {"tail": "zero", "foreign": "zero", "empty": "zero", "existing_policy": "accumulate"},
    "torch.grouped_mm": {"tail": "undefined", "foreign": "zero", "empty": "zero", "existing_policy": "overwrite"},
    "te.grouped_gemm": {"tail": "zero", "foreign": "zero", "empty": "zero", "existing_policy": "overwrite"},
}


def build_problem(case: Case) -> gmm_ref.Problem:
    """The problem a case describes, with its convention's policies, in the case's own layout.

    The convention's gmm_ref front-end, fed ``gmm_ref.arguments(problem)``,
    must describe the same output (shape, dtype, tail / foreign / empty-group
    policies); a ValueError says where they part.
    """
    if case.convention not in POLICIES:
        raise ValueError(f"case {case.name}: convention: expected one of {tuple(POLICIES)}, "
                         f"got {case.convention!r}")
    local = case.num_local_groups
    if case.family != "batch":
        gs = np.asarray(case.group_sizes, dtype=np.int64)
        if local is None:
            local = gs.shape[-1] - case.group_offset
    else:
        gs = None
        local = int(case.groups or 0)
    lshape, rshape = _shapes(case, local)
    dt = _dt.as_dtype(case.dtype, name="dtype")
    kw = {"kind": case.kind, "int_range": case.int_range}
    lhs = values(case.seed, "lhs", lshape, dt, **kw)
    rhs = values(case.seed, "rhs", rshape, dt, **kw)
    p = gmm_ref.Problem(
        case.family, lhs, rhs, gs, lhs_transposed=case.lhs_transposed,
        rhs_transposed=case.rhs_transposed, packed=case.packed, batch_ndim=len(case.batch_shape),
        out_dtype=case.out_dtype, group_offset=case.group_offset, num_local_groups=local,
        convention=case.convention, tiling=case.tiling, **POLICIES[case.convention],
    )
    if case.poison:
        if _dt.is_integer(dt):
            raise ValueError(f"case {case.name}: poison needs float inputs")
        for which in ("lhs", "rhs"):
            arr = getattr(p, which).copy()
            arr[~_touched(p, which)] = np.nan
            p = p.replace(**{which: arr})
    if case.existing:
        p = p.replace(existing_out=values(case.seed, "existing_out", p.out_shape, p.out_dtype, **kw))
    reason = gmm_ref.expressible(p, case.convention)
    if reason:
        raise ValueError(f"case {case.name}: {reason}")
    args, kwargs = gmm_ref.arguments(p)
    front = gmm_ref.problem_from_arguments(case.convention, *args, **kwargs)
    mine, theirs = _promise(p), _promise(front)
    if mine != theirs:
        raise ValueError(f"case {case.name}: the gmm_ref {case.convention} front-end describes "
                         f"{theirs}, the case {mine}")
    return p


def _promise(p: gmm_ref.Problem) -> dict[str, Any]:
    """What a problem says about its output (layouts aside)."""
    d = {"family": p.family, "out_shape": p.out_shape, "out_dtype": str(p.out_dtype),
         "existing": p.existing_out is not None}
    if p.family in ("ragged_m", "ragged_n") and p.existing_out is None:
        d["tail"] = p.tail
        if p.num_local_groups != p.num_groups:
            d["foreign"] = p.foreign
    if p.family == "ragged_k":
        d["empty"] = p.empty
    if p.existing_out is not None:
        d["existing_policy"] = p.existing_policy
    return d


def inputs_of(p: gmm_ref.Problem) -> dict[str, np.ndarray]:
    """The arrays a problem is made of (what :func:`inputs_sha256` hashes)."""
    d = {"lhs": p.lhs, "rhs": p.rhs}
    if p.group_sizes is not None:
        d["group_sizes"] = p.group_sizes
    if p.existing_out is not None:
        d["existing_out"] = p.existing_out
    return d


# ------------------------------------------------------------------------------ hashing
def array_sha256(a: np.ndarray) -> str:
    """sha256 of dtype name, shape and little-endian C-order bytes."""
    a = np.ascontiguousarray(a)
    h = hashlib.sha256(f"{a.dtype}|{list(a.shape)}|".encode())
    h.update(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
    return h.hexdigest()


def inputs_sha256(p: gmm_ref.Problem) -> str:
    h = hashlib.sha256()
    for name, arr in inputs_of(p).items():
        h.update(f"{name}:{array_sha256(arr)};".encode())
    return h.hexdigest()


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------------ storage
_VIEW_AS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _to_storable(a: np.ndarray) -> tuple[np.ndarray, str]:
    """(array NumPy can save, dtype name): ml_dtypes arrays travel as unsigned-int views."""
    name = str(a.dtype)
    if a.dtype.kind == "V" or name in ("bfloat16",) or name.startswith("float8"):
        return np.ascontiguousarray(a).view(_VIEW_AS[a.dtype.itemsize]), name
    return np.ascontiguousarray(a), name


def _from_storable(a: np.ndarray, name: str) -> np.ndarray:
    import ml_dtypes

    dtype = np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)
    if a.dtype == dtype:
        return a
    if a.dtype.itemsize != dtype.itemsize:
        raise GoldenError(f"stored array of {a.dtype} cannot hold dtype {name}")
    return a.view(dtype)


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """A deterministic .npz (stored, not deflated; fixed timestamps): same arrays, same bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for key in sorted(arrays):
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asanyarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, member.getvalue())
    return buf.getvalue()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def canonical_output(out: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``out`` with undefined elements zeroed (bitwise), so goldens are deterministic."""
    out = np.array(out, copy=True)
    bits = out.view(_VIEW_AS[out.dtype.itemsize]) if out.dtype.kind != "b" else out
    bits[~mask] = 0
    return out


@dataclass
class Golden:
    """One stored case, as loaded: its manifest entry, output and mask."""

    case: Case
    entry: dict[str, Any]
    out: np.ndarray
    mask: np.ndarray
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


class GoldenStore:
    """A golden directory: ``manifest.json`` plus one ``.npz`` per case."""

    def __init__(self, directory: str | os.PathLike[str]):
        self.dir = Path(directory)

    @property
    def manifest_path(self) -> Path:
        return self.dir / MANIFEST

    def manifest(self) -> dict[str, Any]:
        """The manifest (an empty one if the directory has none)."""
        path = self.manifest_path
        if not path.exists():
            return {"format": FORMAT, "generator": GENERATOR, "cases": {}}
        try:
            man = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise GoldenError(f"{path}: unreadable manifest ({exc}); restore it from version control") from None
        if not isinstance(man, dict) or man.get("format") != FORMAT or not isinstance(man.get("cases"), dict):
            raise GoldenError(f"{path}: not a format-{FORMAT} golden manifest")
        if man.get("generator") != GENERATOR:
            raise GoldenError(f"{path}: inputs made by generator {man.get('generator')!r}; "
                              f"this tooling has {GENERATOR!r}")
        return man

    def load(self, name: str, entry: dict[str, Any] | None = None) -> Golden:
        """One case's golden, its file hash and contents checked against the manifest."""
        if entry is None:
            entry = self.manifest()["cases"].get(name)
            if entry is None:
                raise GoldenError(f"{self.dir}: no golden for case {name!r}")
        path = self.dir / entry["file"]
        if not path.exists():
            raise GoldenError(f"{path}: missing (case {name}); restore it from version control")
        if _file_sha256(path) != entry["file_sha256"]:
            raise GoldenError(f"{path}: sha256 differs from the manifest (case {name}): "
                              "the file is corrupted or truncated; restore it from version control")
        try:
            with np.load(path, allow_pickle=False) as z:
                arrs = {k: z[k] for k in z.files}
        except Exception as exc:  # noqa: BLE001 - any unreadable file is corruption
            raise GoldenError(f"{path}: unreadable npz (case {name}): {exc}") from None
        names = json.loads(str(arrs.pop("dtypes")))
        got = {k: _from_storable(v, names[k]) for k, v in arrs.items()}
        out, mask = got.pop("out"), got.pop("mask")
        if array_sha256(out) != entry["output_sha256"] or array_sha256(mask) != entry["mask_sha256"]:
            raise GoldenError(f"{path}: output or mask hash differs from the manifest (case {name})")
        return Golden(Case.from_json(entry["spec"]), entry, out, mask, got)

    @staticmethod
    def encode(out: np.ndarray, mask: np.ndarray, inputs: dict[str, np.ndarray] | None = None) -> bytes:
        arrays: dict[str, np.ndarray] = {}
        names: dict[str, str] = {}
        for key, arr in {"out": out, "mask": mask, **(inputs or {})}.items():
            arrays[key], names[key] = _to_storable(np.asarray(arr))
        arrays["dtypes"] = np.array(json.dumps(names, sort_keys=True))
        return _npz_bytes(arrays)


# ----------------------------------------------------------------------------- producers
def _package_version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def reference_producer() -> dict[str, str]:
    """The reference's producer record: exact float64 arithmetic, the same on every platform."""
    return {"name": "reference", "version": f"gmm-harness {_package_version('gmm-harness')}",
            "platform": "any"}


_FRAMEWORKS = {"jax": ("jax", "jaxlib"), "megablox": ("jax", "jaxlib"), "tokamax": ("tokamax", "jax"),
               "ejkernel": ("ejkernel", "jax"), "torch": ("torch",), "te": ("transformer_engine", "jax")}


def _framework_of(kernel: Any) -> tuple[str, ...]:
    name = str(kernel.name)
    fw = _FRAMEWORKS.get(name.split(".")[0].split(":")[0])
    if fw:
        return fw
    fn = getattr(kernel, "fn", None)
    mod = getattr(fn, "__module__", None) or type(kernel).__module__
    return (mod.split(".")[0],)


def _device(framework: str) -> str:
    with contextlib.suppress(Exception):
        if framework == "jax" and "jax" in sys.modules:
            return sys.modules["jax"].devices()[0].device_kind
        if framework == "torch" and "torch" in sys.modules:
            torch = sys.modules["torch"]
            return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return ""


def kernel_producer(kernel: Any) -> dict[str, str]:
    """A kernel's producer record. Adapters may define ``version`` and ``platform``;
    otherwise: the versions of its framework packages, and OS-machine[/device]."""
    version = getattr(kernel, "version", None)
    plat = getattr(kernel, "platform", None)
    version = version() if callable(version) else version
    plat = plat() if callable(plat) else plat
    fw = _framework_of(kernel)
    if not version:
        version = "; ".join(f"{d} {_package_version(d)}" for d in ("gmm-harness", *fw))
    if not plat:
        dev = next((d for d in map(_device, fw) if d), "")
        plat = f"{sys.platform}-{_platform.machine()}" + (f"/{dev}" if dev else "")
    return {"name": str(kernel.name), "version": str(version), "platform": str(plat)}


def numerics_of(kernel: Any, problem: gmm_ref.Problem) -> gmm_ref.Numerics | None:
    """What ``kernel`` declares for ``problem`` (``numerics_for(problem)``, else ``.numerics``)."""
    per = getattr(kernel, "numerics_for", None)
    if callable(per):
        return per(problem)
    return getattr(kernel, "numerics", None)


def _numerics_json(n: gmm_ref.Numerics | None) -> dict[str, Any] | None:
    if n is None:
        return None
    return {"multiply": None if n.multiply is None else str(n.multiply), "accumulate": str(n.accumulate)}


def _numerics_from_json(d: dict[str, Any] | None) -> gmm_ref.Numerics | None:
    return None if d is None else gmm_ref.Numerics(multiply=d["multiply"], accumulate=d["accumulate"])


# ------------------------------------------------------------------------------- kernels
class FunctionKernel:
    """A user function ``fn(*args, **kwargs)`` taking its convention's own arguments."""

    def __init__(self, fn: Callable[..., Any], convention: str, *, name: str | None = None,
                 numerics: gmm_ref.Numerics | None = None, version: str | None = None,
                 platform: str | None = None):
        if convention not in gmm_ref.CONVENTIONS:
            raise ValueError(f"convention: expected one of {gmm_ref.CONVENTIONS}, got {convention!r}")
        self.fn = fn
        self.name = name or f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
        self.convention = convention
        self.numerics = numerics or gmm_ref.Numerics()
        self.version = version
        self.platform = platform

    def available(self) -> str | None:
        return None

    def supports(self, problem: gmm_ref.Problem) -> str | None:
        return gmm_ref.expressible(problem, self.convention)

    def run(self, problem: gmm_ref.Problem) -> np.ndarray:
        args, kwargs = gmm_ref.arguments(problem)
        return as_numpy(self.fn(*args, **kwargs))


def _import_object(target: str) -> Any:
    from property_tests.selection import load_function

    return load_function(target, require_callable=False)


def registry() -> list[Any]:
    """The built-in kernel adapters."""
    import gmm_kernels

    return gmm_kernels.registry()


def resolve_kernel(spec: Any, *, convention: str | None = None,
                   numerics: gmm_ref.Numerics | None = None) -> Any:
    """A kernel adapter from a registry name, a ``pkg.mod:fn`` string, a function or an adapter."""
    if not isinstance(spec, str):
        if hasattr(spec, "run") and hasattr(spec, "convention"):
            return spec
        if callable(spec):
            if convention is None:
                raise ValueError("convention: required to wrap a plain function")
            return wrap_function(spec, convention, numerics=numerics)
        raise TypeError(f"kernel: expected a name, 'pkg.mod:fn', a function or an adapter, got {spec!r}")
    if ":" in spec:
        obj = _import_object(spec)
        if hasattr(obj, "run") and hasattr(obj, "convention"):
            return obj
        if convention is None:
            raise ValueError(f"--convention: required with --kernel {spec} "
                             f"(one of {', '.join(gmm_ref.CONVENTIONS)})")
        return wrap_function(obj, convention, name=spec, numerics=numerics)
    names = []
    for k in registry():
        names.append(k.name)
        if k.name == spec:
            return k
    raise ValueError(f"kernel: no built-in kernel named {spec!r}; known: {names or 'none'} "
                     "(or pass 'pkg.module:function' with --convention)")


def wrap_function(fn: Callable[..., Any], convention: str, *, name: str | None = None,
                  numerics: gmm_ref.Numerics | None = None) -> Any:
    """``fn`` (taking ``convention``'s arguments, as jax arrays or torch tensors) as an adapter."""
    import gmm_kernels

    return gmm_kernels.wrap(fn, convention, name=name, numerics=numerics)


# ------------------------------------------------------------------------------ compare
def _ordered(a: np.ndarray) -> np.ndarray:
    """Floats as integers in value order (adjacent floats differ by 1): ulp distances."""
    if _dt.is_integer(a.dtype):
        return a.astype(np.int64)
    w = a.dtype.itemsize * 8
    if w == 64:
        bits = a.view(np.int64)
        return np.where(bits < 0, -(bits & np.int64(0x7FFFFFFFFFFFFFFF)), bits)
    bits = a.view(_VIEW_AS[a.dtype.itemsize]).astype(np.int64)
    mag = bits & np.int64((1 << (w - 1)) - 1)
    return np.where(bits >> np.int64(w - 1), -mag, mag)


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(_VIEW_AS[a.dtype.itemsize])


def drift(old: np.ndarray, new: np.ndarray, mask: np.ndarray) -> tuple[float, float, int]:
    """(max |new - old|, max ulps apart, elements that differ bitwise) over ``mask``."""
    if old.shape != new.shape or old.dtype != new.dtype:
        return float("nan"), float("nan"), -1
    o, n = old[mask], new[mask]
    differ = _bits(o) != _bits(n)
    if not np.any(differ):
        return 0.0, 0.0, 0
    with np.errstate(invalid="ignore", over="ignore"):
        delta = np.abs(n.astype(np.float64) - o.astype(np.float64))
        ulps = np.abs(_ordered(n) - _ordered(o)).astype(np.float64)
    return float(np.nanmax(delta)) if np.isfinite(delta).any() else float("nan"), \
        float(np.max(ulps)), int(np.sum(differ))


def _group_text(p: gmm_ref.Problem, g: int, index: tuple[int, ...]) -> str:
    if g < 0:
        return "tail (past sum(group_sizes))"
    if p.family == "batch" or p.group_sizes is None:
        return f"group {g}"
    nb = len(p.batch_shape)
    bi = tuple(index[:nb]) if p.family != "ragged_k" else tuple(index[1:1 + nb])
    off = p.offsets_at(bi if p.group_sizes.ndim > 1 else ())
    axis = {"ragged_m": "rows", "ragged_n": "columns", "ragged_k": "K"}[p.family]
    return f"group {g} ({axis} [{off[g]}, {off[g + 1]}))"


def describe_bad(p: gmm_ref.Problem, bad: np.ndarray, mask: np.ndarray, actual: np.ndarray,
                 desired: np.ndarray) -> str:
    """One line: how many defined elements are wrong, in which groups, and the first one."""
    from gmm_ref.compare import group_of

    idx = np.argwhere(bad)
    seen: dict[int, tuple[int, ...]] = {}
    for ix in idx[:20000]:
        t = tuple(int(v) for v in ix)
        seen.setdefault(group_of(p, t), t)
    groups = ", ".join(_group_text(p, g, t) for g, t in sorted(seen.items())[:6])
    if len(seen) > 6:
        groups += f", ... ({len(seen)} groups)"
    first = tuple(int(v) for v in idx[0])
    a, d = actual[first], desired[first]
    return (f"{len(idx)} / {int(mask.sum())} defined elements wrong in {groups}; "
            f"first at {list(first)}: {_fmt(a)} vs {_fmt(d)}")


def _fmt(x: Any) -> str:
    return repr(int(x)) if np.issubdtype(np.asarray(x).dtype, np.integer) else repr(float(x))


@dataclass
class GoldenResult:
    """One (kernel, case) check: ``status`` is ``pass``, ``fail`` or ``unsupported``."""

    kernel: str
    case: str
    status: str
    detail: str = ""
    message: str = field(default="", repr=False)
    mode: str = ""  # "bit-for-bit" or "bound"

    def line(self) -> str:
        extra = f" ({self.mode})" if self.mode and self.status == "pass" else ""
        return f"{self.status.upper():<11} {self.kernel} :: {self.case}{extra}" + \
            (f": {self.detail}" if self.detail else "")


def compare_output(kernel: Any, golden: Golden, problem: gmm_ref.Problem, actual: Any) -> GoldenResult:
    """Judge one kernel output against a golden: bit for bit when the golden is the
    kernel's own (same name, version and platform), else within the gmm_ref bound for
    the kernel's declared numerics."""
    name, case = str(kernel.name), golden.case.name
    try:
        act = as_numpy(actual)
    except Exception as exc:  # noqa: BLE001
        return GoldenResult(name, case, "fail", f"case {case}: output not convertible: {exc}")
    if act.shape != golden.out.shape or act.dtype != golden.out.dtype:
        return GoldenResult(name, case, "fail",
                            f"case {case}: shape/dtype {act.shape} {act.dtype}, expected "
                            f"{golden.out.shape} {golden.out.dtype}", mode="shape")
    producer = golden.entry.get("producer", {})
    if producer == kernel_producer(kernel):
        got = canonical_output(act, golden.mask)
        _, ulps, n = drift(golden.out, got, golden.mask)
        if n == 0:
            return GoldenResult(name, case, "pass", mode="bit-for-bit")
        bad = golden.mask & (_bits(got) != _bits(golden.out))
        line = describe_bad(problem, bad, golden.mask, act, golden.out)
        return GoldenResult(name, case, "fail",
                            f"case {case}: not bit-for-bit equal to its own golden "
                            f"({producer['version']}, {producer['platform']}), max {ulps:g} ulps: {line}",
                            mode="bit-for-bit")
    ref = problem.reference()
    act = canonical_output(act, ref.mask)  # undefined elements may hold any bits (uninitialised memory)
    outcome = gmm_ref.check(act, ref, numerics=numerics_of(kernel, problem), kernel=name)
    if outcome.ok:
        return GoldenResult(name, case, "pass", mode="bound")
    if outcome.bad is None:
        return GoldenResult(name, case, "fail", f"case {case}: {outcome.message.splitlines()[-1]}",
                            outcome.message, mode="bound")
    line = describe_bad(problem, outcome.bad, ref.mask, act, ref.values)
    crit = outcome.message.splitlines()[1] if len(outcome.message.splitlines()) > 1 else ""
    return GoldenResult(name, case, "fail", f"case {case}: {line}; {crit}", outcome.message,
                        mode="bound")


def _selected(names: Iterable[str], patterns: Sequence[str] | None) -> list[str]:
    if not patterns:
        return list(names)
    return [n for n in names if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)]


def _split_patterns(cases: str | Sequence[str] | None) -> list[str] | None:
    if cases is None:
        return None
    if isinstance(cases, str):
        return [c for c in cases.split(",") if c]
    return list(cases)


def check_kernel(kernel: Any, directory: str | os.PathLike[str], *, cases: str | Sequence[str] | None = None,
                 convention: str | None = None) -> list[GoldenResult]:
    """One kernel against every golden of its convention in ``directory``."""
    k = resolve_kernel(kernel, convention=convention)
    store = GoldenStore(directory)
    man = store.manifest()
    names = _selected(sorted(man["cases"]), _split_patterns(cases))
    mine = [n for n in names if man["cases"][n]["spec"]["convention"] == k.convention]
    name = str(k.name)
    reason = k.available()
    if reason:
        return [GoldenResult(name, n, "unsupported", f"kernel unavailable: {reason}") for n in mine]
    results = []
    for n in mine:
        try:
            golden = store.load(n, man["cases"][n])
            problem = build_problem(golden.case)
        except (GoldenError, ValueError, TypeError) as exc:
            results.append(GoldenResult(name, n, "fail", f"case {n}: golden unusable: {exc}"))
            continue
        why = k.supports(problem)
        if why:
            results.append(GoldenResult(name, n, "unsupported", why))
            continue
        try:
            out = k.run(problem)
        except Exception as exc:  # noqa: BLE001 - a kernel crash is a failure of this case
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            results.append(GoldenResult(name, n, "fail", f"case {n}: raised {type(exc).__name__}: {first}"))
            continue
        results.append(compare_output(k, golden, problem, out))
    return results


def check_kernels(kernels: Sequence[Any] | None = None, directory: str | os.PathLike[str] | None = None, *,
                  cases: str | Sequence[str] | None = None) -> list[GoldenResult]:
    """Every kernel (default: ``gmm_kernels.registry()``) against the goldens of its convention.

    Returns one :class:`GoldenResult` per (kernel, case); unavailable kernels
    give ``unsupported`` results carrying the reason.
    """
    if directory is None:
        directory = default_directory()
    out: list[GoldenResult] = []
    for k in registry() if kernels is None else kernels:
        out.extend(check_kernel(k, directory, cases=cases))
    return out


def default_directory() -> Path:
    """``golden/data`` of the repository in the working directory (``GMM_GOLDEN_DIR`` overrides)."""
    env = os.environ.get("GMM_GOLDEN_DIR")
    return Path(env) if env else Path.cwd() / "golden" / "data"


# ---------------------------------------------------------------------------- regenerate
class _Progress:
    """A plain-text progress bar on stderr (a line per step when stderr is not a terminal)."""

    def __init__(self, total: int, label: str, stream: Any = None):
        self.total, self.label, self.done = total, label, 0
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def step(self, what: str) -> None:
        self.done += 1
        width = 24
        fill = width * self.done // max(self.total, 1)
        text = f"{self.label} [{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} {what}"
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if self.done == self.total else ""))
        elif self.done == self.total or self.done % max(1, self.total // 8) == 0:
            self.stream.write(text + "\n")  # not a terminal: a few lines, not one per step
        self.stream.flush()


@dataclass
class Change:
    """A golden that regeneration would add or change."""

    case: str
    status: str  # "new", "changed", "spec", "stale"
    max_delta: float = 0.0
    max_ulps: float = 0.0
    n_diff: int = 0
    within_bound: bool | None = None
    note: str = ""


def drift_table(changes: Sequence[Change]) -> str:
    rows = [("case", "change", "elements", "max |delta|", "max ulps", "within bound")]
    for c in changes:
        wb = "-" if c.within_bound is None else ("yes" if c.within_bound else "NO")
        rows.append((c.case, c.status + (f" ({c.note})" if c.note else ""),
                     "-" if c.status in ("new", "stale") else str(c.n_diff),
                     "-" if c.status in ("new", "stale") else f"{c.max_delta:.4g}",
                     "-" if c.status in ("new", "stale") else f"{c.max_ulps:g}", wb))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _produce(case: Case, kernel: Any | None) -> tuple[gmm_ref.Problem, np.ndarray, np.ndarray, dict, Any, str]:
    """(problem, canonical output, mask, producer, numerics, failure) for one case."""
    p = build_problem(case)
    ref = p.reference()
    if kernel is None:
        return p, canonical_output(ref.values, ref.mask), ref.mask, reference_producer(), None, ""
    out = canonical_output(as_numpy(kernel.run(p)), ref.mask)
    numerics = numerics_of(kernel, p)
    outcome = gmm_ref.check(out, ref, numerics=numerics, kernel=kernel.name)
    fail = ""
    if not outcome.ok:
        fail = "output outside the gmm_ref bound: " + (
            describe_bad(p, outcome.bad, ref.mask, out, ref.values) if outcome.bad is not None
            else outcome.message.splitlines()[-1])
        return p, out, ref.mask, kernel_producer(kernel), numerics, fail
    return p, out, ref.mask, kernel_producer(kernel), numerics, fail


def regenerate(corpus: Sequence[Case] | None, directory: str | os.PathLike[str], *,
               kernel: Any = None, convention: str | None = None, cases: str | Sequence[str] | None = None,
               update: bool = False, store_inputs: bool = False, command: str = "python -m golden",
               where: str = "", stream: Any = None) -> tuple[int, str]:
    """Recompute goldens; write them atomically. Returns (exit status, report text).

    Adds goldens for new cases; refuses (status 1, naming the command to run)
    to change an existing golden unless ``update``. With ``kernel`` only the
    cases of its convention are produced, by that kernel. ``corpus=None``
    regenerates the cases the directory's manifest already holds.
    """
    stream = stream or sys.stderr
    store = GoldenStore(directory)
    store.dir.mkdir(parents=True, exist_ok=True)
    man = store.manifest()
    old = man["cases"]
    if corpus is None:
        corpus = [Case.from_json(e["spec"]) for e in old.values()]
    by_name: dict[str, Case] = {}
    for c in corpus:
        if c.name in by_name:
            raise GoldenError(f"corpus: duplicate case name {c.name!r}")
        by_name[c.name] = c
    patterns = _split_patterns(cases)
    names = _selected(sorted(by_name), patterns)
    k = None
    if kernel is not None:
        k = resolve_kernel(kernel, convention=convention)
        reason = k.available()
        if reason:
            return 1, f"kernel {k.name} is unavailable: {reason}"
        names = [n for n in names if by_name[n].convention == k.convention]
    if patterns and not names:
        return 1, f"--cases {','.join(patterns)}: matches no case" + (f" of convention {k.convention}" if k else "")

    changes: list[Change] = []
    pending: dict[str, tuple[dict[str, Any], bytes]] = {}
    refresh: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    failures: list[str] = []
    bar = _Progress(len(names), "regenerate", stream)
    for n in names:
        case = by_name[n]
        if k is not None:
            why = k.supports(build_problem(case))
            if why:
                skipped.append(f"{n}: unsupported by {k.name}: {why}")
                bar.step(n + " (unsupported)")
                continue
        try:
            p, out, mask, producer, numerics, fail = _produce(case, k)
        except Exception as exc:  # noqa: BLE001 - reported, nothing written
            if k is None:
                raise
            first = (str(exc).strip().splitlines() or [""])[0]
            p, fail = None, f"raised {type(exc).__name__}: {first}"
        bar.step(n)
        if fail:
            failures.append(f"{n}: {k.name}: {fail}")
            continue
        inputs = inputs_of(p) if store_inputs else None
        data = GoldenStore.encode(out, mask, inputs)
        fsha = hashlib.sha256(data).hexdigest()
        entry = {
            "spec": case.to_json(),
            "file": f"{n}-{fsha[:10]}.npz",
            "file_sha256": fsha,
            "inputs_sha256": inputs_sha256(p),
            "output_sha256": array_sha256(out),
            "mask_sha256": array_sha256(mask),
            "out_shape": list(out.shape),
            "dtypes": {"lhs": str(p.lhs.dtype), "rhs": str(p.rhs.dtype), "out": str(out.dtype)},
            "producer": producer,
            "numerics": _numerics_json(numerics),
            "inputs_stored": bool(store_inputs),
        }
        prev = old.get(n)
        if prev is None:
            changes.append(Change(n, "new", within_bound=True))
            pending[n] = (entry, data)
            continue
        if prev == entry:
            continue
        same_bits = (prev["output_sha256"] == entry["output_sha256"]
                     and prev["mask_sha256"] == entry["mask_sha256"]
                     and prev["spec"] == entry["spec"] and prev["inputs_sha256"] == entry["inputs_sha256"])
        if same_bits and prev.get("inputs_stored") == entry["inputs_stored"]:
            if update:  # only metadata (producer version, numerics) moved on
                refresh[n] = entry
            continue
        try:
            old_golden = store.load(n, prev)
            dmax, ulps, ndiff = drift(old_golden.out, out, mask & old_golden.mask
                                      if old_golden.mask.shape == mask.shape else mask)
        except GoldenError as exc:
            dmax, ulps, ndiff = float("nan"), float("nan"), -1
            note = f"old file unusable: {exc}"
        else:
            note = ""
        what = []
        if prev["spec"] != entry["spec"]:
            what.append("spec")
        if prev["inputs_sha256"] != entry["inputs_sha256"]:
            what.append("inputs")
        if prev["producer"] != entry["producer"]:
            what.append(f"producer {prev['producer']['name']} -> {producer['name']}")
        changes.append(Change(n, "changed", dmax, ulps, ndiff, True, note or ", ".join(what)))
        pending[n] = (entry, data)
    stale = [] if patterns or k is not None else sorted(set(old) - set(by_name))
    changes += [Change(n, "stale", note="not in the corpus") for n in stale]

    report: list[str] = []
    if skipped:
        report.append("skipped:\n" + "\n".join("  " + s for s in skipped))
    if failures:
        report.append("kernel failures (nothing written):\n" + "\n".join("  " + f for f in failures))
        return 1, "\n".join(report)
    changed = [c for c in changes if c.status != "new"]
    added = [c.case for c in changes if c.status == "new"]
    if added:
        report.append(f"new: {len(added)} case(s): " + ", ".join(added[:12]) + (" ..." if len(added) > 12 else ""))
    if changed:
        report.append(drift_table(changed))
    if changed and not update:
        named = len(changed) <= 8 and not stale and not patterns
        sel = (" --cases " + ",".join(c.case for c in changed) if named
               else f" --cases {','.join(patterns)}" if patterns else "")
        kern = f" --kernel {kernel if isinstance(kernel, str) else k.name}" if k is not None else ""
        conv = f" --convention {convention}" if convention and k is not None else ""
        report.append(f"{len(changed)} existing golden(s) would change; nothing was written.\n"
                      f"If the change is intended, run: {command} regenerate{kern}{conv}{sel} --update{where}")
        return 1, "\n".join(report)
    if not pending and not refresh and not stale:
        report.append(f"{len(names)} golden(s) up to date in {store.dir}")
        return 0, "\n".join(report)
    new_cases = dict(old)
    for n in stale:
        del new_cases[n]
    new_cases.update(refresh)
    for n, (entry, data) in pending.items():
        path = store.dir / entry["file"]
        if not (path.exists() and _file_sha256(path) == entry["file_sha256"]):
            _atomic_write(path, data)
        new_cases[n] = entry
    new_man = {"format": FORMAT, "generator": GENERATOR,
               "cases": {n: new_cases[n] for n in sorted(new_cases)}}
    _atomic_write(store.manifest_path, (json.dumps(new_man, indent=1, sort_keys=True) + "\n").encode())
    _remove_unreferenced(store, new_man)
    report.append(f"wrote {len(pending)} golden(s)" + (f", refreshed {len(refresh)}" if refresh else "")
                  + (f", removed {len(stale)} stale" if stale else "") + f" in {store.dir}")
    return 0, "\n".join(report)


def _remove_unreferenced(store: GoldenStore, man: dict[str, Any]) -> None:
    keep = {e["file"] for e in man["cases"].values()}
    for path in store.dir.glob("*.npz"):
        if path.name not in keep:
            with contextlib.suppress(OSError):
                path.unlink()


# -------------------------------------------------------------------------------- verify
def verify(directory: str | os.PathLike[str], corpus: Sequence[Case] | None = None, *,
           cases: str | Sequence[str] | None = None, command: str = "python -m golden",
           where: str = "", stream: Any = None) -> tuple[int, str]:
    """Check a golden directory: file hashes, manifest consistency (with ``corpus``
    when given), inputs recomputed from the specs, and the reference reproducing
    its own goldens bit for bit (kernel goldens: within the bound). Returns
    (exit status, report)."""
    store = GoldenStore(directory)
    errors: list[str] = []
    warnings: list[str] = []
    try:
        man = store.manifest()
    except GoldenError as exc:
        return 1, f"golden verify FAILED\n  {exc}"
    if not store.manifest_path.exists():
        return 1, f"golden verify FAILED\n  {store.manifest_path}: missing; run: {command} regenerate{where}"
    entries = man["cases"]
    names = _selected(sorted(entries), _split_patterns(cases))
    if corpus is not None:
        specs = {c.name: c for c in corpus}
        wanted = _selected(sorted(specs), _split_patterns(cases))
        missing = [n for n in wanted if n not in entries]
        if missing:
            errors.append(f"{len(missing)} case(s) of the corpus have no golden: {', '.join(missing[:8])}; "
                          f"run: {command} regenerate{where}")
        for n in wanted:
            if n in entries and entries[n]["spec"] != specs[n].to_json():
                errors.append(f"{n}: the corpus spec differs from the manifest's; "
                              f"run: {command} regenerate --cases {n} --update{where}")
        extra = [n for n in names if n not in specs]
        if extra:
            warnings.append(f"{len(extra)} golden(s) not in the corpus (stale): {', '.join(extra[:8])}")
    referenced = {e.get("file") for e in entries.values()}
    for path in sorted(store.dir.iterdir()) if store.dir.is_dir() else []:
        if path.name != MANIFEST and path.name not in referenced:
            warnings.append(f"{path.name}: not referenced by the manifest (left over from an interrupted run?)")
    bar = _Progress(len(names), "verify", stream or sys.stderr)
    for n in names:
        entry = entries[n]
        bar.step(n)
        try:
            g = store.load(n, entry)
            if g.case.name != n:
                raise GoldenError(f"manifest entry {n!r} holds the spec of {g.case.name!r}")
            p = build_problem(g.case)
        except (GoldenError, ValueError, TypeError, KeyError) as exc:
            errors.append(f"{n}: {exc}")
            continue
        if inputs_sha256(p) != entry["inputs_sha256"]:
            errors.append(f"{n}: inputs recomputed from the spec differ from the recorded hash "
                          f"(the generator or gmm_ref's front-end changed)")
            continue
        for key, arr in g.inputs.items():
            want = inputs_of(p).get(key)
            if want is None or array_sha256(arr) != array_sha256(want):
                errors.append(f"{n}: stored input {key!r} differs from the one recomputed from the spec")
        if g.out.shape != p.out_shape or str(g.out.dtype) != str(p.out_dtype) \
                or entry["dtypes"]["out"] != str(p.out_dtype):
            errors.append(f"{n}: golden output {g.out.shape} {g.out.dtype} but the problem gives "
                          f"{p.out_shape} {p.out_dtype}")
            continue
        ref = p.reference()
        if not np.array_equal(ref.mask, g.mask):
            errors.append(f"{n}: the defined-mask differs from gmm_ref's "
                          f"({int((ref.mask != g.mask).sum())} elements); "
                          f"run: {command} regenerate --cases {n} --update{where}")
            continue
        if entry["producer"]["name"] == "reference":
            dmax, ulps, ndiff = drift(g.out, canonical_output(ref.values, ref.mask), ref.mask)
            if ndiff:
                errors.append(f"{n}: the reference no longer reproduces its golden bit for bit: {ndiff} "
                              f"element(s) differ, max |delta| {dmax:.4g}, max {ulps:g} ulps; if intended, run: "
                              f"{command} regenerate --cases {n} --update{where}")
        else:
            out = gmm_ref.check(g.out, ref, numerics=_numerics_from_json(entry.get("numerics")))
            if not out.ok:
                why = (describe_bad(p, out.bad, ref.mask, g.out, ref.values) if out.bad is not None
                       else out.message.splitlines()[-1])
                errors.append(f"{n}: golden by {entry['producer']['name']} is outside the gmm_ref bound: {why}")
    lines = []
    if errors:
        lines.append(f"golden verify FAILED: {len(errors)} problem(s) in {store.dir}")
        lines += ["  " + e for e in errors]
    else:
        lines.append(f"golden verify ok: {len(names)} case(s) in {store.dir}")
    lines += ["  warning: " + w for w in warnings]
    return (1 if errors else 0), "\n".join(lines)


# ----------------------------------------------------------------------------------- cli
def _load_corpus(spec: str) -> list[Case]:
    if spec.endswith(".json") or os.path.isdir(spec):
        path = Path(spec)
        man = GoldenStore(path if path.is_dir() else path.parent).manifest() if path.is_dir() \
            else json.loads(path.read_text())
        return [Case.from_json(e["spec"]) for e in man["cases"].values()]
    obj = _import_object(spec)
    obj = obj() if callable(obj) else obj
    return [c if isinstance(c, Case) else Case.from_json(c) for c in obj]


def summary(corpus: Sequence[Case]) -> str:
    """Counts of cases per convention, family, dtype and tag."""
    from collections import Counter

    def count(key: Callable[[Case], Iterable[str]]) -> str:
        cnt: Counter[str] = Counter()
        for c in corpus:
            cnt.update(key(c))
        return ", ".join(f"{k} {v}" for k, v in sorted(cnt.items()))

    return "\n".join([
        f"{len(corpus)} cases",
        "conventions: " + count(lambda c: [c.convention]),
        "families:    " + count(lambda c: [c.family]),
        "dtypes:      " + count(lambda c: [c.dtype]),
        "edge tags:   " + count(lambda c: c.tags),
    ])


def main(argv: Sequence[str] | None = None, *, corpus: Sequence[Case] | None = None,
         default_dir: str | os.PathLike[str] | None = None, prog: str = "python -m property_tests.goldens") -> int:
    """The golden command line. ``corpus``/``default_dir``: what ``--corpus``/``--dir`` default to."""
    ap = argparse.ArgumentParser(prog=prog, description="Golden outputs for grouped-GEMM kernels.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--dir", default=None, help=f"golden directory (default: {default_dir or 'golden/data'})")
        sp.add_argument("--cases", default=None, help="comma-separated glob(s) of case names")
        sp.add_argument("--corpus", default=None,
                        help="'pkg.mod:CASES' or a manifest.json/directory whose specs to use")

    def kernel_opts(sp: argparse.ArgumentParser, required: bool = False) -> None:
        sp.add_argument("--kernel", default=None, required=required,
                        help="a built-in kernel name (gmm_kernels.registry()) or 'pkg.module:function'")
        sp.add_argument("--convention", default=None, choices=gmm_ref.CONVENTIONS,
                        help="the calling convention of a 'pkg.module:function' kernel")
        sp.add_argument("--multiply", default=None, help="declared multiply dtype of a function kernel")
        sp.add_argument("--accumulate", default="float32", help="declared accumulator of a function kernel")
        sp.add_argument("--kernel-version", default=None,
                        help="version recorded for the kernel (goldens match bit for bit only on the same one)")

    sp = sub.add_parser("regenerate", help="recompute goldens (reference, or --kernel)")
    common(sp)
    kernel_opts(sp)
    sp.add_argument("--update", action="store_true", help="allow changing existing goldens")
    sp.add_argument("--store-inputs", action="store_true", help="also store the (recomputable) inputs")
    sp = sub.add_parser("verify", help="hashes, manifest consistency, reference reproduces its goldens")
    common(sp)
    sp = sub.add_parser("check", help="kernels against the goldens of their convention")
    common(sp)
    kernel_opts(sp)
    sp = sub.add_parser("list", help="the corpus' cases")
    common(sp)
    args = ap.parse_args(argv)

    directory = Path(args.dir or default_dir or default_directory())
    where = f" --dir {args.dir}" if args.dir else ""
    command = prog
    try:
        cor = _load_corpus(args.corpus) if args.corpus else (list(corpus) if corpus is not None else None)
        if args.cmd == "list":
            cor = cor if cor is not None else _load_corpus(str(directory))
            for c in _selected_cases(cor, args.cases):
                print(f"{c.name:<44} {c.convention:<18} {c.family:<9} {c.dtype:<9} {' '.join(c.tags)}")
            print(summary(_selected_cases(cor, args.cases)), file=sys.stderr)
            return 0
        numerics = None
        if getattr(args, "kernel", None) and ":" in args.kernel:
            numerics = gmm_ref.Numerics(multiply=args.multiply, accumulate=args.accumulate)
        if args.cmd == "regenerate":
            kern = resolve_kernel(args.kernel, convention=args.convention, numerics=numerics) \
                if args.kernel else None
            if kern is not None and args.kernel_version:
                kern.version = args.kernel_version
            rc, text = regenerate(cor, directory, kernel=kern, convention=args.convention, cases=args.cases,
                                  update=args.update, store_inputs=args.store_inputs, command=command,
                                  where=where)
        elif args.cmd == "verify":
            rc, text = verify(directory, cor, cases=args.cases, command=command, where=where)
        else:
            kernels = ([resolve_kernel(args.kernel, convention=args.convention, numerics=numerics)]
                       if args.kernel else None)
            if kernels and args.kernel_version:
                kernels[0].version = args.kernel_version
            results = check_kernels(kernels, directory, cases=args.cases)
            text = "\n".join(r.line() for r in results) or "no kernel has goldens of its convention here"
            counts = {s: sum(r.status == s for r in results) for s in ("pass", "fail", "unsupported")}
            text += "\n" + ", ".join(f"{v} {k}" for k, v in counts.items())
            rc = 1 if counts["fail"] else 0
    except (GoldenError, ValueError, TypeError, ImportError, AttributeError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    print(text, file=sys.stdout if rc == 0 else sys.stderr)
    return rc


def _selected_cases(corpus: Sequence[Case], cases: str | None) -> list[Case]:
    keep = set(_selected([c.name for c in corpus], _split_patterns(cases)))
    return [c for c in corpus if c.name in keep]


if __name__ == "__main__":
    # run the imported module's main, so that Case is one class for the corpus and the tooling
    from property_tests.goldens import main as _main

    sys.exit(_main())
