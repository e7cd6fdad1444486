"""A kernel named by its import path runs in a process of its own, the host; the judge never imports it.

The judge (the process that draws problems, computes the reference and compares) starts one host per kernel
(:class:`KernelHost`). The host imports the kernel and waits for calls over a pair of pipes that only the two of
them hold. A call carries the kernel's arguments exactly as the judge made them: guarded copies whose buffers
travel whole (``gmm_kernels.sandbox.wire``), so the kernel reads and writes the same layout, margins included. The
host calls the kernel (on its device, within its own tamper watch) and sends back the output's bytes and what its
copies of the buffers hold after the call; the judge writes those into its own buffers, where its guard regions,
its input checks and its reference are, none of them ever in the kernel's reach. A gradient and the operators a
kernel calls are asked for the same way.

What the host sends is read without unpickling or importing anything (``wire``), so a kernel can send the judge
nothing but bytes it could as well have returned. A host that crashes or breaks the protocol fails the call it was
in (:class:`HostCrashed`, naming how it ended) and is started again for the next. A host dies with its judge
(``PR_SET_PDEATHSIG``), and ends when its pipe closes.

The host process's own side is ``gmm_kernels.sandbox.kernel_process``; :class:`KernelHost` starts it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import subprocess
import sys
import weakref
from typing import Any

import numpy as np

from gmm_kernels.sandbox import tamper, wire

__all__ = ["ENTRY", "HostCrashed", "HostedFunction", "KernelHost", "ended", "hosted", "hosted_error", "no_ptrace"]

#: how much an answer may hold beyond what the call sent (an output, gradients): a kernel cannot make the judge
#: allocate without bound
_ANSWER_SLACK = 1 << 30

#: the builtin exception types an exception raised in the host is rebuilt as (its own type's name kept)
BUILTIN_ERRORS = {c.__name__: c for c in (
    ValueError, TypeError, RuntimeError, AssertionError, NotImplementedError, IndexError, KeyError,
    ZeroDivisionError, ArithmeticError, OverflowError, FloatingPointError, MemoryError, AttributeError,
    ImportError, ModuleNotFoundError, OSError, LookupError, RecursionError, Exception)}


class HostCrashed(BaseException):
    """The kernel's host process ended (or broke the protocol) during a call. Not an ``Exception``: it is not
    shrunk (each call would start a new process) nor caught as a kernel's error; it ends the check, and the main
    job's worker reports it as the cell's crash, with the last problem the kernel was given."""


def no_ptrace() -> None:
    """Make this process non-dumpable (Linux): another process of the same user (a kernel's host) can then
    neither open its ``/proc/PID/fd`` or ``/proc/PID/mem`` nor attach to it. Best effort elsewhere."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0


#: the host's command (``python -c``; ``gmm_kernels.sandbox.kernel_process``)
ENTRY = "import os; from gmm_kernels.sandbox.kernel_process import main; os._exit(main())"


def ended(code: int) -> str:
    """How a process ended, from its exit status (negative: the signal that killed it)."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


@functools.lru_cache(maxsize=256)
def _error_type(name: str, module: str, base: type[BaseException]) -> type[BaseException]:
    """One class per kernel exception type: the same exception rebuilt twice is of the same type (Hypothesis tells
    failures apart by their type; a new class per call would make one steady failure several, and flaky)."""
    return type(name, (base,), {"__module__": module})


def hosted_error(entry: Any) -> BaseException:
    """The exception the host reported, rebuilt in the judge: ``gmm_ref.Mismatch`` (with its kind) and
    ``KernelExit`` as themselves, another type as a builtin base of it carrying its name, the host's traceback
    as a note. Nothing of the host's is imported or unpickled."""
    from gmm_kernels.base import KernelExit
    from gmm_ref import Mismatch

    if not isinstance(entry, dict):
        return RuntimeError(f"the kernel's process sent an answer that is not one: {entry!r:.200}")
    name, module = str(entry.get("type", "Exception"))[:100], str(entry.get("module", ""))[:200]
    message = str(entry.get("message", ""))[:20000]
    if entry.get("mismatch"):
        exc: BaseException = Mismatch(message, kind=str(entry.get("kind") or "mismatch"))
    elif name == "KernelExit" and module == "gmm_kernels.base":
        exc = KernelExit(message)
    else:
        base = BUILTIN_ERRORS.get(str(entry.get("base", "")), RuntimeError)
        if module == "builtins" and name == base.__name__:
            exc = base(message)
        else:
            exc = _error_type(name if name.isidentifier() else "KernelError", module, base)(message)
    tb = str(entry.get("traceback", ""))[-6000:]
    if tb:
        exc.add_note(f"in the kernel's own process:\n{tb.rstrip()}")
    return exc


class KernelHost:
    """The judge's handle on one kernel's host process: :meth:`load` once, then :meth:`call`, :meth:`vjp` and
    :meth:`primitives`. Started on first use and again after it crashed; closed at exit."""

    def __init__(self, spec: str, *, environ: dict[str, str] | None = None) -> None:
        self.spec = spec
        self.environ = dict(environ or {})
        self._proc: subprocess.Popen[bytes] | None = None
        self._fds: tuple[int, int] | None = None
        self.loaded: dict[str, Any] | None = None
        self.option = "--kernel"
        #: the convention the kernel is called in (set by its adapter)
        self.convention: str | None = None
        self.starts = 0
        _HOSTS.add(self)

    # ----------------------------------------------------------------------------------------- process
    def _start(self) -> None:
        from gmm_kernels.sandbox import device

        to_host_r, to_host_w = os.pipe()
        from_host_r, from_host_w = os.pipe()
        env = {**os.environ, **self.environ}
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join([p for p in (root, env.get("PYTHONPATH")) if p])  # (the harness itself)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", ENTRY, str(os.getpid()), str(to_host_r), str(from_host_w)],
                pass_fds=(to_host_r, from_host_w), env=env, stdin=subprocess.DEVNULL)
            tamper.exempt(self._proc.pid)  # the harness's process, not one the kernel started
        finally:
            os.close(to_host_r)
            os.close(from_host_w)
        self._fds = (from_host_r, to_host_w)
        self.starts += 1
        # the judge's import path, so that what imports here imports there (a test's directory, a tmp module)
        answer, _ = self._ask({"op": "load", "spec": self.spec, "device": device.selected(), "option": self.option,
                            "path": [p for p in sys.path if isinstance(p, str)]}, [])
        if self.loaded is None:
            self.loaded = answer
        elif answer != self.loaded:
            raise HostCrashed(f"{self.spec} loaded differently in a restarted process: {answer} vs {self.loaded}")

    def load_as(self, option: str = "--kernel") -> dict[str, Any]:
        """What the kernel is (``{"kind": "function", "name", "convention", "scope"}``, or ``{"kind": "adapter"}``),
        starting the host. An error importing it is raised here, as the judge's own import would have raised it,
        naming ``option``."""
        self.option = option
        if self._proc is None:
            self._start()
        assert self.loaded is not None
        return self.loaded

    def close(self) -> None:
        """End the host: its pipe closed (it exits), killed if it has not within 2 s."""
        proc, fds = self._proc, self._fds
        self._proc = self._fds = None
        if fds is not None:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.wait(timeout=2)
            if proc.poll() is None:
                with contextlib.suppress(Exception):
                    proc.kill()
                    proc.wait(timeout=5)

    def _crashed(self, why: str) -> HostCrashed:
        """The call's crash: how the host ended, or (one still running that broke the protocol) what it sent."""
        proc, code = self._proc, None
        if proc is not None:
            with contextlib.suppress(Exception):
                code = proc.wait(timeout=1)  # a host that died closed the pipe: it has ended, or ends now
        self.close()
        if code is None:  # (close stopped it)
            return HostCrashed(f"crashed: the kernel's process broke off the call: {why}")
        return HostCrashed(f"crashed: the kernel's process {ended(code)} during the call")

    def _ask(self, header: dict[str, Any], frames: wire.Frames, *, expect: int = 0
             ) -> tuple[dict[str, Any], list[bytearray]]:
        """Send one message; the answer's header and frames (the host's error raised here)."""
        if self._proc is None:
            self._start()
        assert self._fds is not None
        read_fd, write_fd = self._fds
        try:
            wire.send(write_fd, header, frames)
            answer, got = wire.receive(read_fd, limit=expect + _ANSWER_SLACK)
        except (OSError, EOFError, wire.HostError) as exc:
            raise self._crashed(f"{type(exc).__name__}: {exc}") from None
        if "error" in answer:
            raise hosted_error(answer["error"])
        return answer, got

    # ------------------------------------------------------------------------------------------- calls
    def _packed(self, op: str, value: Any, **extra: Any) -> tuple[wire.Packed, Any, list[bytearray]]:
        from gmm_kernels.runtimes import compile_cache
        from gmm_kernels.sandbox import recycle

        packed = wire.Packed(value)
        head, frames = packed.message()
        header = {"op": op, **head, "recycling": recycle.pool() is not None, "convention": self.convention,
                  "compile_cache": os.environ.get(compile_cache.ENV), **extra}
        answer, got = self._ask(header, frames, expect=packed.returned_bytes())
        return packed, answer, got

    def call(self, args: tuple, kwargs: dict) -> np.ndarray:
        """The kernel called on ``args``/``kwargs`` (the convention's NumPy arguments, guarded copies) in the
        host; its output as NumPy. What the host's copies of the arguments hold afterwards is written into these."""
        packed, answer, frames = self._packed("call", (args, kwargs))
        out = wire.decode_array(answer.get("out"), frames)
        packed.write_back(frames, answer.get("changed"))
        return out.copy()

    def vjp(self, args: tuple, kwargs: dict, cotangent: np.ndarray) -> dict[str, np.ndarray]:
        """The kernel's reverse-mode gradients (``gmm_kernels.sandbox.autodiff.vjp``), computed in the host."""
        packed, answer, frames = self._packed("vjp", (args, kwargs, np.asarray(cotangent)))
        names = answer.get("grads")
        if not isinstance(names, list) or not all(isinstance(n, list) and len(n) == 2 for n in names):
            raise wire.HostError(f"the kernel's process sent gradients that are not a list: {names!r:.200}")
        grads = {str(name): wire.decode_array(entry, frames).copy() for name, entry in names}
        packed.write_back(frames, answer.get("changed"))
        return grads

    def primitives(self, args: tuple, kwargs: dict) -> frozenset[str]:
        """The jax primitives or torch operators the kernel calls on these arguments, as the host saw them."""
        _, answer, _ = self._packed("primitives", (args, kwargs))
        names = answer.get("primitives")
        return frozenset(str(n)[:200] for n in names) if isinstance(names, list) else frozenset()


_HOSTS: weakref.WeakSet[KernelHost] = weakref.WeakSet()


def hosted(adapter: Any) -> bool:
    """Whether ``adapter``'s kernel runs in a process of its own."""
    return isinstance(getattr(adapter, "fn", None), HostedFunction)


class HostedFunction:
    """The judge's stand-in for a kernel function that lives in its :class:`KernelHost`: it carries what the host
    said of the function (its name, declared convention and scope) and is never called itself; the adapter
    (``gmm_kernels.user.FunctionAdapter``) sends its calls to :attr:`host`."""

    def __init__(self, host: KernelHost, loaded: dict[str, Any]) -> None:
        self.host = host
        module, _, qualname = str(loaded.get("name", host.spec)).partition(":")
        self.__module__, self.__qualname__ = module, qualname or host.spec
        self.__name__ = self.__qualname__.rpartition(".")[2]
        self.__gmm_convention__ = loaded.get("convention")
        #: whether it launches Triton kernels in Triton's interpreter (``gmm_kernels.user``)
        self.__gmm_interpreted__ = bool(loaded.get("interpreted"))
        scope = loaded.get("scope")
        self.__gmm_scope__ = None if scope is None else wire.decode_record(scope)
        numerics = loaded.get("numerics")  # a routed kernel's, declared apart from its scope
        self.__gmm_numerics__ = None if numerics is None else wire.decode_record(numerics)
        weakref.finalize(self, host.close)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self.host.spec} runs in its own process: call it through its adapter")

    def __repr__(self) -> str:
        return f"<{self.host.spec} in its own process>"


@atexit.register
def _close_all() -> None:
    for host in list(_HOSTS):
        host.close()
