"""The kernel's side of ``gmm_kernels.sandbox.host``: the process that imports a kernel named by its import path
and calls it for the judge.

It starts by giving up what could reach the judge: it dies with the judge (``PR_SET_PDEATHSIG``), and drops every
capability (a host running as root could otherwise open the judge's descriptors through ``/proc``). Then it serves
the judge's messages (``gmm_kernels.sandbox.wire``) until its pipe closes: ``load`` imports the kernel and says what
it is (a function, its declared convention and scope); ``call``, ``vjp`` and ``primitives`` rebuild the judge's
arguments over buffers of the same layout (kept by the judge's addresses from one call to the next, so that calls
the judge makes in the same buffers get the same buffers here too), call the kernel through its adapter, in its
tamper watch and on its device, and send back the output's bytes and what the buffers hold after the call. An
exception goes back as its type's name, its message and its traceback.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import signal
import sys
import traceback
from typing import Any

import numpy as np

from gmm_kernels.sandbox import wire
from gmm_kernels.sandbox.host import BUILTIN_ERRORS

__all__ = ["main"]


def _die_with_parent(parent: int) -> None:
    """End with the judge: killed when it dies (Linux), and at once if it died before this was set."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(0)


def _drop_privileges() -> None:
    """Give up every capability (Linux), for good: a host running as root could otherwise reach a non-dumpable
    process of the judge's through ``/proc`` (``CAP_SYS_PTRACE``), and a program it starts would get them back
    (hence the bounding set and ``no_new_privs``). A process without capabilities loses nothing here. Best effort
    elsewhere."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
        for cap in range(64):
            if libc.prctl(24, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # PR_CAPBSET_DROP; EINVAL: no more
                break
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
        data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; twice (64 bits)
        libc.capset(header, data)


class _Host:
    """The host process's state: the kernel's adapter, and the buffers of the last call (kept by the judge's
    addresses, so that a call in buffers the judge reused gets the host's same buffers: a cache keyed by
    address sees what it would see in one process)."""

    def __init__(self) -> None:
        self.adapter: Any = None
        self.last: dict[tuple[int, int], Any] = {}
        self.recycling: contextlib.ExitStack | None = None
        self.cache: str | None = None

    def load(self, header: dict[str, Any]) -> dict[str, Any]:
        from gmm_kernels.base import KernelAdapter
        from gmm_kernels.resolve import load_object
        from gmm_kernels.runtimes import triton_interpreter
        from gmm_kernels.sandbox import device

        judge = [str(p) for p in header.get("path", ())]
        sys.path[:] = judge + [p for p in sys.path if p not in judge]
        device.select(header.get("device") or "auto", option="the judge's device")
        obj = load_object(header["spec"], option=str(header.get("option") or "--kernel"))
        if isinstance(obj, KernelAdapter) or (isinstance(obj, type) and issubclass(obj, KernelAdapter)):
            return {"kind": "adapter"}
        if not callable(obj):
            return {"kind": type(obj).__name__}
        triton_interpreter.ready(obj)
        self.fn = obj
        scope = getattr(obj, "__gmm_scope__", None)
        interpreted = triton_interpreter.in_use() and triton_interpreter.reaches_triton_kernels(obj)
        numerics = getattr(obj, "__gmm_numerics__", None)
        return {"kind": "function", "name": f"{getattr(obj, '__module__', '?')}:{getattr(obj, '__qualname__', '?')}",
                "interpreted": interpreted,
                "numerics": None if numerics is None else wire.encode_record(numerics),
                "convention": getattr(obj, "__gmm_convention__", None),
                "scope": None if scope is None else wire.encode_record(scope)}

    def _adapter(self, convention: str) -> Any:
        from gmm_kernels.user import wrap

        if self.adapter is None or self.adapter.convention != convention:
            self.adapter = wrap(self.fn, convention, name=self.name)
        return self.adapter

    def unpack(self, header: dict[str, Any], frames: list[bytearray]) -> Any:
        """The judge's value, its arrays rebuilt over buffers of the same layout holding the bytes sent."""
        owners, now = [], {}
        frames.pop(0)  # (the pickle: read below, once the arrays exist)
        self.sent = list(frames)  # each run as it came, to send back only the runs the call changed
        for index, entry in enumerate(header["owners"]):
            key = (int(entry["key"][0]), int(entry["key"][1]))
            kept = self.last.get(key)
            owner = kept if kept is not None and kept[0] == entry["kind"] else None
            if owner is None:
                owner = (entry["kind"], self._allocate(entry, header, index))
            flat = self._flat(owner)
            for s, n in entry["runs"]:
                raw = frames.pop(0)
                if n:
                    if owner[0] == "numpy":
                        flat[s:s + n] = np.frombuffer(raw, np.uint8)
                    else:
                        import torch

                        flat[s:s + n].copy_(torch.frombuffer(raw, dtype=torch.uint8))
            owners.append((owner, entry["runs"]))
            now[key] = owner
        self.last = now
        self.owners = owners
        arrays = [self._view(a, owners[a["owner"]][0]) for a in header["arrays"]]

        class _Unpickler(pickle.Unpickler):
            def persistent_load(self, pid: Any) -> Any:
                return arrays[pid[1]]

        return _Unpickler(io.BytesIO(self._pickled)).load()

    @staticmethod
    def _allocate(entry: dict[str, Any], header: dict[str, Any], index: int) -> Any:
        if entry["kind"] == "numpy":
            return np.zeros(int(entry["nbytes"]), np.uint8)
        import torch

        from gmm_kernels.sandbox import device

        user = next(a for a in header["arrays"] if a["owner"] == index)
        dtype = getattr(torch, user["dtype"])
        if int(entry["nbytes"]) > wire._SPARSE_BYTES and torch.device(user["device"]).type == "cpu":
            base = device.reserve(int(user["elements"]), dtype)
        else:
            base = torch.empty(int(user["elements"]), dtype=dtype, device=user["device"])
        return base

    @staticmethod
    def _flat(owner: tuple[str, Any]) -> Any:
        kind, buf = owner
        if kind == "numpy":
            return buf
        import torch

        return torch.empty(0, dtype=torch.uint8, device=buf.device).set_(buf.untyped_storage())

    @staticmethod
    def _view(entry: dict[str, Any], owner: tuple[str, Any]) -> Any:
        kind, buf = owner
        if kind == "numpy":
            dtype = wire._safe_dtype(entry["dtype"]) if entry["dtype"] != "bool" else np.dtype(bool)
            return np.ndarray(tuple(entry["shape"]), dtype, buffer=buf, offset=int(entry["offset"]),
                              strides=tuple(entry["strides"]))
        import torch

        return torch.as_strided(buf, tuple(entry["shape"]), tuple(entry["strides"]), int(entry["offset"]))

    def returned(self) -> tuple[list[bool], wire.Frames]:
        """Which runs of the call's buffers the kernel changed, and those runs as it left them."""
        changed: list[bool] = []
        frames: wire.Frames = []
        sent = iter(self.sent)
        for (kind, buf), runs in self.owners:
            flat = self._flat((kind, buf))
            for s, n in runs:
                now = flat[s:s + n] if kind == "numpy" else flat[s:s + n].cpu().numpy()
                changed.append(memoryview(now).cast("B") != memoryview(next(sent)))
                if changed[-1]:
                    frames.append(now)
        return changed, frames

    def serve(self, header: dict[str, Any], frames: list[bytearray]) -> tuple[dict[str, Any], wire.Frames]:
        """One message of the judge's, answered: (the answer's header, its frames)."""
        op = header.get("op")
        if op == "load":
            self.name = header["spec"]
            return self.load(header), []
        self._settle(header)
        self._pickled = bytes(frames[0])
        adapter = self._adapter(header["convention"])
        if op == "call":
            return self._call(adapter, *self.unpack(header, frames))
        if op == "vjp":
            return self._vjp(adapter, *self.unpack(header, frames))
        if op == "primitives":
            return self._primitives(adapter, *self.unpack(header, frames))
        raise ValueError(f"unknown operation {op!r}")

    def _settle(self, header: dict[str, Any]) -> None:
        """The judge's state that this process follows: its compilation cache, and whether it makes its calls in
        the same buffers (``recycle.recycling``: the device copies are kept here too)."""
        from gmm_kernels.sandbox import recycle

        cache = header.get("compile_cache")
        if cache and self.cache is None:  # the judge's compilation cache, once it has one (compile_cache.ensure)
            from gmm_kernels.runtimes import compile_cache

            os.environ[compile_cache.ENV] = self.cache = str(cache)
            compile_cache.ensure()
        want = bool(header.get("recycling"))
        if want and self.recycling is None:
            self.recycling = contextlib.ExitStack()
            self.recycling.enter_context(recycle.recycling())
        elif not want and self.recycling is not None:
            self.recycling.close()
            self.recycling = None

    def _call(self, adapter: Any, args: tuple, kwargs: dict) -> tuple[dict[str, Any], wire.Frames]:
        from gmm_kernels.sandbox import convert, device, guards
        from gmm_ref.dtypes import as_numpy

        out_frames: wire.Frames = []
        # an output the kernel allocates with guards.torch_empty lies in a guarded base here, checked here
        with guards.call(adapter.name) as allocated, convert.written_back():
            out = adapter.invoke(*args, **kwargs)
            if adapter.convention_facts.framework == "torch":
                device.synchronize()
            entry = wire.encode_array(as_numpy(out, name=f"output of {adapter.name}", strict=True), out_frames)
        allocated.check()
        changed, back = self.returned()
        return {"out": entry, "changed": changed}, out_frames + back

    def _vjp(self, adapter: Any, args: tuple, kwargs: dict, cotangent: Any) -> tuple[dict[str, Any], wire.Frames]:
        from gmm_kernels.base import watched_call
        from gmm_kernels.sandbox import autodiff, convert

        with convert.written_back(), watched_call(adapter.name):
            grads = autodiff.vjp(adapter.fn, adapter.convention_facts, args, kwargs, cotangent, name=adapter.name)
        out_frames: wire.Frames = []
        entries = [[k, wire.encode_array(np.asarray(v), out_frames)] for k, v in grads.items()]
        changed, back = self.returned()
        return {"grads": entries, "changed": changed}, out_frames + back

    @staticmethod
    def _primitives(adapter: Any, args: tuple, kwargs: dict) -> tuple[dict[str, Any], wire.Frames]:
        from gmm_kernels.base import torch_operators
        from gmm_kernels.sandbox.convert import jax_primitives, jax_x64, to_framework, uses_64bit

        if adapter.convention_facts.framework == "jax":
            with jax_x64(uses_64bit(*args, *kwargs.values())):
                a, kw = to_framework("jax", args, kwargs)
                seen = jax_primitives(adapter.fn, a, kw)
        else:
            try:
                seen = torch_operators(adapter.invoke, args, kwargs)
            except Exception:  # noqa: BLE001 - what it called before failing is still what it called
                seen = frozenset()
        return {"primitives": sorted(seen)}, []


def _error_entry(exc: BaseException) -> dict[str, Any]:
    from gmm_ref import Mismatch

    base = next((c.__name__ for c in type(exc).__mro__ if c.__name__ in BUILTIN_ERRORS and c.__module__ ==
                 "builtins"), "RuntimeError")
    return {"type": type(exc).__name__, "module": type(exc).__module__, "base": base, "message": str(exc),
            "mismatch": isinstance(exc, Mismatch), "kind": getattr(exc, "kind", None),
            "traceback": _kernel_frames(exc)}


#: the harness's own packages: their frames are left out of a kernel's traceback
_HARNESS = tuple(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), p) + os.sep
                 for p in ("gmm_kernels", "gmm_ref", "property_tests", "golden"))


def _kernel_frames(exc: BaseException, keep: int = 12) -> str:
    """The traceback of an exception the call raised, its last ``keep`` frames outside the harness's own code (the
    kernel's, and the libraries it called), and the exception's line; "" where every frame is the harness's (an
    error of the harness's own checks, whose message says it all)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_HARNESS)]
    if not frames:
        return ""
    shown = "".join(traceback.format_list(frames[-keep:]))
    more = f"  ... {len(frames) - keep} frames before these\n" if len(frames) > keep else ""
    return f"Traceback (the kernel's frames, the harness's left out):\n{more}{shown}{type(exc).__name__}: {exc}"[-6000:]


def main(argv: list[str] | None = None) -> int:
    """Serve the judge's calls until the pipe closes (argv: the judge's pid, then the two descriptors)."""
    parent, read_fd, write_fd = (int(a) for a in (argv if argv is not None else sys.argv[1:])[:3])
    _die_with_parent(parent)
    _drop_privileges()
    from gmm_kernels.runtimes.process import prepare_process

    prepare_process(host=False)
    host = _Host()
    while True:
        try:
            header, frames = wire.receive(read_fd, limit=1 << 40)
        except EOFError:
            return 0
        try:
            answer, out = host.serve(header, frames)
        except BaseException as exc:  # noqa: BLE001 - whatever the call raised is the judge's to report
            answer, out = {"error": _error_entry(exc)}, []
        wire.send(write_fd, answer, out)

