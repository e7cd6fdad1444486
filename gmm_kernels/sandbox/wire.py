"""What travels between the judge and a kernel's host process (``gmm_kernels.sandbox.host``), and how.

A message is a JSON header followed by raw byte frames, each length-prefixed, over a pipe. From the judge to the
host anything the judge built may travel (the host trusts the judge): an array goes as the bytes of the buffer it
is a view of (its owner: guard margins, a slice's neighbours and all) and the view taken of it, so the kernel gets
the same memory layout it would get in the judge's process; other values are pickled. From the host to the judge
nothing is unpickled and nothing is imported: an array is a dtype name, a shape and its bytes; a declaration is
tagged JSON that builds only the harness's own records (:data:`RECORDS`); an exception is its type's name, its
message and the host's traceback as text. So what a kernel can send the judge is what it could have returned.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
import struct
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "RECORDS",
    "SPARSE_MARGIN",
    "Frames",
    "HostError",
    "decode_array",
    "decode_record",
    "encode_array",
    "encode_record",
    "receive",
    "send",
]

#: a JSON header larger than this from the host is refused (a kernel writing junk into the channel)
_MAX_HEADER = 16 * 2**20
#: elements kept on either side of each contiguous block of a tensor that lies in a large reservation (the large
#: mode's strided cells): its margins travel with it, nothing else of the reservation does
SPARSE_MARGIN = 4096
#: a torch tensor whose storage is larger than this travels as its blocks and their margins only
_SPARSE_BYTES = 256 * 2**20

Frames = list[Any]


class HostError(RuntimeError):
    """The host process broke the protocol or ended: what it sent cannot be read as an answer."""


# ------------------------------------------------------------------------------------------------ framing
def _write_all(fd: int, data: Any) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view[:1 << 24])
        view = view[n:]


def _read_exact(fd: int, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = os.readv(fd, [view[got:got + (1 << 24)]])
        if k == 0:
            raise HostError("the channel closed in the middle of a message")
        got += k
    return buf


def send(fd: int, header: dict[str, Any], frames: Frames = ()) -> None:
    """Write one message: ``header`` (JSON) and ``frames`` (bytes-like, C-contiguous)."""
    head = json.dumps({**header, "frames": [memoryview(f).nbytes for f in frames]}).encode()
    _write_all(fd, struct.pack("<Q", len(head)) + head)
    for f in frames:
        _write_all(fd, f)


def receive(fd: int, *, limit: int) -> tuple[dict[str, Any], list[bytearray]]:
    """Read one message; its frames may hold ``limit`` bytes in all. ``EOFError`` if the channel is closed before
    the message begins; :class:`HostError` for a message that breaks the protocol."""
    first = os.read(fd, 8)
    if not first:
        raise EOFError("the channel is closed")
    first = bytes(first) + (bytes(_read_exact(fd, 8 - len(first))) if len(first) < 8 else b"")
    (size,) = struct.unpack("<Q", first)
    if size > _MAX_HEADER:
        raise HostError(f"a message header of {size} bytes (at most {_MAX_HEADER})")
    try:
        header = json.loads(bytes(_read_exact(fd, size)))
        sizes = [int(n) for n in header.get("frames", ())]
    except (ValueError, TypeError, AttributeError) as exc:
        raise HostError(f"a message that is not a JSON header: {exc}") from None
    if not isinstance(header, dict) or any(n < 0 for n in sizes) or sum(sizes) > limit:
        raise HostError(f"a message of {sum(sizes)} bytes of frames (at most {limit})")
    return header, [_read_exact(fd, n) for n in sizes]


# ------------------------------------------------------------------------------------------------ arrays
def _safe_dtype(name: Any) -> np.dtype:
    """A dtype from its name as the host sent it: a plain numeric dtype (NumPy's or ml_dtypes'), never an object,
    string or structured one."""
    import ml_dtypes

    if not isinstance(name, str) or len(name) > 32:
        raise HostError(f"a dtype name that is not a short string: {name!r}")
    kind = getattr(ml_dtypes, name, None)
    try:
        dtype = np.dtype(kind) if isinstance(kind, type) else np.dtype(name)
    except TypeError:
        raise HostError(f"an unknown dtype {name!r}") from None
    if dtype.hasobject or dtype.fields is not None or dtype.kind in "OSUaMm" or dtype.subdtype is not None:
        raise HostError(f"a dtype that is not numeric: {name!r}")
    return dtype


def encode_array(a: np.ndarray, frames: Frames) -> dict[str, Any]:
    """``a`` (host to judge) as a header entry, its bytes appended to ``frames``."""
    a = np.ascontiguousarray(a)
    frames.append(a.reshape(-1).view(np.uint8) if a.size else b"")
    return {"dtype": str(a.dtype), "shape": list(a.shape)}


def decode_array(entry: Any, frames: list[bytearray]) -> np.ndarray:
    """The array :func:`encode_array` described, from the frames consumed in order (``frames`` is popped)."""
    if not isinstance(entry, dict) or not frames:
        raise HostError(f"an array entry {entry!r} without its bytes")
    dtype = _safe_dtype(entry.get("dtype"))
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape) or len(shape) > 8:
        raise HostError(f"an array shape that is not a list of sizes: {shape!r}")
    raw = frames.pop(0)
    count = int(np.prod(shape, dtype=np.int64))
    if len(raw) != count * dtype.itemsize:
        raise HostError(f"{len(raw)} bytes for an array of {shape} {dtype}")
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


# ------------------------------------------------------------------------------------------------ records
def _records() -> dict[str, type]:
    from gmm_kernels.scope import KnownIssue, Scope
    from gmm_ref import Numerics, RoutedNumerics
    from gmm_ref.scaled import quantizers

    named = {f"{c.__module__}:{c.__qualname__}": c for c in (Scope, KnownIssue, Numerics, RoutedNumerics)}
    for value in vars(quantizers).values():
        if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__module__ == quantizers.__name__:
            named[f"{value.__module__}:{value.__qualname__}"] = value
    return named


#: the records a declaration from the host may build (by ``module:qualname``), made on first use
RECORDS: dict[str, type] = {}


def encode_record(value: Any, *, call: Callable[[Callable[[], Any]], Any] | None = None) -> Any:
    """``value`` (a declared scope or numerics, and what they hold) as tagged JSON. A callable inside (a known
    issue's ``condition``) cannot travel: it is called here (``call`` wraps the call) and its answer travels."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.dtype) or (isinstance(value, type) and issubclass(value, np.generic)):
        return {"$dtype": str(np.dtype(value))}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if callable(v) and not isinstance(v, type):
                v = bool((call or (lambda fn: fn()))(v))
                fields[f.name] = {"$answer": v}
            else:
                fields[f.name] = encode_record(v, call=call)
        return {"$record": f"{type(value).__module__}:{type(value).__qualname__}", "fields": fields}
    if isinstance(value, tuple | list):
        return {"$tuple": [encode_record(v, call=call) for v in value]}
    if isinstance(value, dict) or hasattr(value, "items"):
        return {"$map": [[encode_record(k, call=call), encode_record(v, call=call)] for k, v in value.items()]}
    raise TypeError(f"a {type(value).__name__} in a declaration cannot be sent to the judge: {value!r}")


def decode_record(value: Any, depth: int = 0) -> Any:
    """What :func:`encode_record` sent: only JSON values, dtypes and the harness's own :data:`RECORDS`, each built
    through its constructor (so its own checks apply)."""
    if depth > 16:
        raise HostError("a declaration nested too deep")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if not isinstance(value, dict) or len(value) > 2:
        raise HostError(f"a declaration entry that is not tagged: {value!r:.80}")
    if "$dtype" in value:
        return _safe_dtype(value["$dtype"])
    if "$answer" in value:
        answer = bool(value["$answer"])
        return lambda: answer
    if "$tuple" in value and isinstance(value["$tuple"], list):
        return tuple(decode_record(v, depth + 1) for v in value["$tuple"])
    if "$map" in value and isinstance(value["$map"], list):
        return {decode_record(k, depth + 1): decode_record(v, depth + 1) for k, v in value["$map"]}
    if "$record" in value and isinstance(value.get("fields"), dict):
        if not RECORDS:
            RECORDS.update(_records())
        cls = RECORDS.get(value["$record"])
        if cls is None:
            raise HostError(f"a declaration of {value['$record']!r}, which is not one of the harness's records")
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        fields = value["fields"]
        if not set(fields) <= names:
            raise HostError(f"{value['$record']}: unknown fields {sorted(set(fields) - names)}")
        return cls(**{k: decode_record(v, depth + 1) for k, v in fields.items()})
    raise HostError(f"a declaration entry that is not tagged: {value!r:.80}")


# ------------------------------------------------------------------------------------ arguments (judge side)
class _ArgPickler(pickle.Pickler):
    """Pickles the judge's arguments with every array taken out (:meth:`persistent_id`): arrays travel as owner
    buffers and views (:func:`pack_arguments`)."""

    def __init__(self, file: Any, take: Callable[[Any], int | None]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._take = take

    def persistent_id(self, obj: Any) -> Any:
        index = self._take(obj)
        return None if index is None else ("array", index)


def _owner(a: np.ndarray) -> np.ndarray:
    owner = a
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    return owner


def _runs(t: Any) -> list[tuple[int, int]]:
    """(start, length) in elements of the storage of torch tensor ``t`` that travel: all of it, or for a storage
    past ``_SPARSE_BYTES`` each contiguous block of ``t`` with :data:`SPARSE_MARGIN` elements either side."""
    n = t.untyped_storage().nbytes() // t.element_size()
    if n * t.element_size() <= _SPARSE_BYTES or t.numel() == 0:
        return [(0, n)]
    block, inner = 1, t.ndim
    while inner > 0 and t.stride(inner - 1) == block:
        block *= t.shape[inner - 1]
        inner -= 1
    starts = np.full(1, t.storage_offset(), np.int64)
    for d in range(inner):
        starts = (starts[:, None] + np.arange(t.shape[d], dtype=np.int64)[None, :] * t.stride(d)).reshape(-1)
    runs, end = [], -1
    for s in np.sort(starts):
        lo, hi = max(int(s) - SPARSE_MARGIN, 0), min(int(s) + block + SPARSE_MARGIN, n)
        if runs and lo <= end:
            runs[-1] = (runs[-1][0], hi - runs[-1][0])
        else:
            runs.append((lo, hi - lo))
        end = runs[-1][0] + runs[-1][1]
    return runs


class Packed:
    """The judge's side of one call's arguments: what was sent (:meth:`message`), and :meth:`write_back` of what
    the host's buffers hold after the call into the judge's own."""

    def __init__(self, value: Any) -> None:
        self.owners: list[tuple[str, Any, list[tuple[int, int]]]] = []  # (kind, owner, runs)
        self.arrays: list[dict[str, Any]] = []
        self._ids: dict[int, int] = {}
        buf = io.BytesIO()
        _ArgPickler(buf, self._take).dump(value)
        self.pickled = buf.getvalue()

    def _owner_index(self, key: int, kind: str, owner: Any, runs: list[tuple[int, int]]) -> int:
        if key not in self._ids:
            self._ids[key] = len(self.owners)
            self.owners.append((kind, owner, runs))
        return self._ids[key]

    def _take(self, obj: Any) -> int | None:
        if type(obj) is np.ndarray:
            owner = _owner(obj)
            if not (owner.flags.c_contiguous or owner.flags.f_contiguous) or obj.size == 0:
                owner = obj = np.array(obj, copy=True, order="C")
            base = owner.__array_interface__["data"][0]
            entry = {"kind": "numpy", "dtype": str(obj.dtype), "shape": list(obj.shape),
                     "strides": list(obj.strides), "offset": obj.__array_interface__["data"][0] - base}
            entry["owner"] = self._owner_index(id(owner), "numpy", owner, [(0, owner.nbytes)])
        else:
            import sys

            torch = sys.modules.get("torch")
            if torch is None or type(obj) is not torch.Tensor:
                return None
            storage = obj.untyped_storage()
            runs = _runs(obj)
            item = obj.element_size()
            entry = {"kind": "torch", "dtype": str(obj.dtype).removeprefix("torch."), "shape": list(obj.shape),
                     "strides": list(obj.stride()), "offset": obj.storage_offset(), "device": str(obj.device),
                     "owner": self._owner_index(storage.data_ptr() or id(obj), "torch", obj,
                                                [(s * item, n * item) for s, n in runs])}
            entry["elements"] = storage.nbytes() // item
        self.arrays.append(entry)
        return len(self.arrays) - 1

    def message(self) -> tuple[dict[str, Any], Frames]:
        """The header entries and frames of these arguments: each owner's runs of bytes."""
        frames, owners = [], []
        for kind, owner, runs in self.owners:
            raw = _raw(kind, owner)
            owners.append({"kind": kind, "nbytes": _nbytes(kind, owner), "runs": runs,
                           "key": [_address(kind, owner), _nbytes(kind, owner)]})
            frames += [raw[s:s + n] for s, n in runs]
        return {"arrays": self.arrays, "owners": owners}, [self.pickled, *frames]

    def write_back(self, frames: list[bytearray], changed: Any) -> None:
        """The owners' runs the host says the call changed (``changed``: a flag per run sent), as it holds them
        after the call, written into the judge's buffers."""
        count = sum(len(runs) for _, _, runs in self.owners)
        if not isinstance(changed, list) or len(changed) != count:
            raise HostError(f"the host's list of changed buffers is not one flag per run sent: {changed!r:.200}")
        flags = iter(changed)
        for kind, owner, runs in self.owners:
            for s, n in runs:
                if not next(flags):
                    continue
                if not frames:
                    raise HostError("fewer buffers came back than were sent")
                got = frames.pop(0)
                if len(got) != n:
                    raise HostError(f"{len(got)} bytes came back for a run of {n}")
                if kind == "numpy":
                    if owner.flags.writeable:
                        _raw(kind, owner)[s:s + n] = np.frombuffer(got, np.uint8)
                elif n:
                    import torch

                    _raw(kind, owner).flat[s:s + n].copy_(torch.frombuffer(got, dtype=torch.uint8))

    def returned_bytes(self) -> int:
        return sum(n for _, _, runs in self.owners for _, n in runs)


def _address(kind: str, owner: Any) -> int:
    return owner.__array_interface__["data"][0] if kind == "numpy" else owner.untyped_storage().data_ptr()


def _nbytes(kind: str, owner: Any) -> int:
    return owner.nbytes if kind == "numpy" else owner.untyped_storage().nbytes()


def _raw(kind: str, owner: Any) -> Any:
    """A flat uint8 view of an owner's memory (a CUDA storage: a host copy)."""
    if kind == "numpy":
        return owner.T.reshape(-1).view(np.uint8) if not owner.flags.c_contiguous else owner.reshape(-1).view(np.uint8)
    import torch

    storage = owner.untyped_storage()
    flat = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    return _TorchBytes(flat)


class _TorchBytes:
    """Slices of a storage's bytes as host memoryviews (read on demand, so a reservation is never read whole)."""

    def __init__(self, flat: Any) -> None:
        self.flat = flat

    def __getitem__(self, item: slice) -> Any:
        return self.flat[item].cpu().numpy()
