"""The golden store: a directory with ``manifest.json`` and one ``.npz`` per case, hashed and written atomically.

Each ``<case>-<sha10>.npz`` holds ``out`` and ``mask`` (plus ``dtypes``; the
inputs only with ``store_inputs``); the manifest records, per case, the spec,
the inputs' sha256, the file's, output's and mask's sha256, the output shape,
the producer (``reference`` or a kernel's name, version and platform), its
declared numerics and the dtypes. Writes go to a temporary name, then
``os.replace``; file names carry their content hash, so a new golden never
overwrites one the current manifest names; the manifest is replaced last.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import gmm_ref
from golden.case import Case, GoldenError, inputs_of
from golden.generator import GENERATOR

__all__ = ["FORMAT", "MANIFEST", "PROG", "Golden", "GoldenStore", "array_sha256", "atomic_write", "canonical_output",
           "default_directory", "file_sha256", "inputs_sha256"]

FORMAT = 2
MANIFEST = "manifest.json"
#: what a write leaves behind while it runs (or when it is killed); never read as a golden
TEMPORARY = ".*.tmp-*"
REFERENCE = "reference"


def producer_key(producer: dict[str, Any]) -> str:
    """The key a golden is stored under beside the other producers' goldens of the same case."""
    if producer.get("name") == REFERENCE:
        return REFERENCE
    return f"{producer.get('name')} | {producer.get('version')} | {producer.get('platform')}"


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


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


VIEW_AS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _to_storable(a: np.ndarray) -> tuple[np.ndarray, str]:
    """(array NumPy can save, dtype name): ml_dtypes arrays travel as unsigned-int views."""
    name = str(a.dtype)
    if a.dtype.kind == "V" or name in ("bfloat16",) or name.startswith("float8"):
        return np.ascontiguousarray(a).view(VIEW_AS[a.dtype.itemsize]), name
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


def _fsync_directory(directory: Path) -> None:
    with contextlib.suppress(OSError, AttributeError):  # not every platform can open a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary name beside ``path``, fsync it, then rename it over ``path``.

    A killed write leaves at most a temporary file (``TEMPORARY``), never a partial golden."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_directory(path.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def canonical_output(out: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``out`` with undefined elements zeroed (bitwise), so goldens are deterministic."""
    out = np.array(out, copy=True)
    bits = out.view(VIEW_AS[out.dtype.itemsize]) if out.dtype.kind != "b" else out
    bits[~mask] = 0
    return out


def corpus_of(man: dict[str, Any]) -> list[Case]:
    """The cases of a (format-2) manifest, each from its reference golden's spec where there is one."""
    return [Case.from_json(g.get(REFERENCE, next(iter(g.values())))["spec"]) for g in man["cases"].values()]


def read_manifest(path: Path) -> dict[str, Any]:
    """A manifest file, checked, in format 2 (a format-1 file's entries grouped by producer)."""
    try:
        man = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GoldenError(f"{path}: unreadable manifest ({exc}); restore it from version control") from None
    if not isinstance(man, dict) or man.get("format") not in (1, FORMAT) or not isinstance(man.get("cases"), dict):
        raise GoldenError(f"{path}: not a format-{FORMAT} golden manifest")
    if man.get("generator") != GENERATOR:
        raise GoldenError(f"{path}: inputs made by generator {man.get('generator')!r}; "
                          f"this tooling has {GENERATOR!r}")
    if man["format"] == 1:  # one golden per case: the same entries, grouped by producer
        man = {**man, "format": FORMAT,
               "cases": {n: {producer_key(e.get("producer", {})): e} for n, e in man["cases"].items()}}
    for name, goldens in man["cases"].items():
        if not isinstance(goldens, dict) or not goldens or not all(isinstance(e, dict) for e in goldens.values()):
            raise GoldenError(f"{path}: case {name!r} does not map producers to golden entries")
    return man


@dataclass
class Golden:
    """One stored case, as loaded: its manifest entry, output and mask."""

    case: Case
    entry: dict[str, Any]
    out: np.ndarray
    mask: np.ndarray
    inputs: dict[str, np.ndarray] = field(default_factory=dict)


#: how the golden command line is run (its suggestions name it)
PROG = "python -m golden"


def default_directory() -> Path:
    """This project's golden data (``GMM_GOLDEN_DIR`` overrides), wherever the package is installed."""
    env = os.environ.get("GMM_GOLDEN_DIR")
    return Path(env) if env else Path(__file__).resolve().parent / "data"


class GoldenStore:
    """A golden directory: ``manifest.json`` plus one ``.npz`` per case."""

    def __init__(self, directory: str | os.PathLike[str]):
        self.dir = Path(directory)

    @property
    def manifest_path(self) -> Path:
        return self.dir / MANIFEST

    def manifest(self) -> dict[str, Any]:
        """The manifest (an empty one if the directory has none): ``cases`` maps each case to its
        goldens by producer key (the reference's and each kernel version's, side by side)."""
        path = self.manifest_path
        if not path.exists():
            return {"format": FORMAT, "generator": GENERATOR, "cases": {}}
        return read_manifest(path)

    def corpus(self) -> list[Case]:
        """The cases the manifest holds (each from its reference golden's spec where there is one)."""
        return corpus_of(self.manifest())

    def goldens(self, man: dict[str, Any] | None = None) -> list[tuple[str, str, dict[str, Any]]]:
        """Every ``(case, producer key, entry)`` of the manifest, sorted."""
        cases = (man or self.manifest())["cases"]
        return [(n, key, cases[n][key]) for n in sorted(cases) for key in sorted(cases[n])]

    def write_manifest(self, cases: dict[str, dict[str, dict[str, Any]]]) -> None:
        """Replace the manifest atomically (cases and producers sorted, so diffs stay small)."""
        man = {"format": FORMAT, "generator": GENERATOR,
               "cases": {n: {k: cases[n][k] for k in sorted(cases[n])} for n in sorted(cases) if cases[n]}}
        atomic_write(self.manifest_path, (json.dumps(man, indent=1, sort_keys=True) + "\n").encode())


    def clean_temporaries(self) -> list[str]:
        """Remove what killed writes left behind (call it holding the directory's lock)."""
        removed = []
        for path in self.dir.glob(TEMPORARY):
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path.name)
        return removed

    def load(self, name: str, entry: dict[str, Any]) -> Golden:
        """One case's golden (a manifest entry), its file hash and contents checked against it."""
        path = self.dir / entry["file"]
        if not path.exists():
            raise GoldenError(f"{path}: missing (case {name}); restore it from version control")
        if file_sha256(path) != entry["file_sha256"]:
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
