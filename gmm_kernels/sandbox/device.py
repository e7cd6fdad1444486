"""The device torch-convention kernels run on: its one owner.

``--device`` (the main job), ``--gmm-device`` (the pytest plugin) and
``check_kernel(device=...)`` take ``auto`` (the default: CUDA when torch sees a
GPU, else the CPU), ``cpu``, ``cuda`` (torch's current CUDA device) or
``cuda:N``. :func:`resolve` turns the text into a concrete device (``cpu``,
``cuda:0``); a malformed value, or a CUDA device torch does not see, is a
``ValueError`` naming the option and what was expected (the callers' usage
error). :func:`select` makes a device the process's selection: the main job
selects it and sends it, resolved, to its workers (``WorkRequest.device``), so
that ``auto`` means the same there. ``gmm_kernels.sandbox.convert.to_torch`` puts
operands, offsets and harness-allocated outputs on :func:`selected`.

jax-convention kernels run where jax puts them (:func:`jax_device`: jax's
default device); :func:`of` says, for any kernel, the device it runs on. torch
is imported only where a value needs it (``auto`` where torch is installed,
``cuda``), jax only by :func:`jax_device`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import re
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["EXPECTED", "cpu_only", "cuda_only", "jax_device", "of", "on_cuda", "parse", "place", "reserve", "resolve",
           "select", "selected", "synchronize", "torch_device", "using"]

#: what a device option takes, for its usage errors
EXPECTED = "auto, cpu, cuda or cuda:N (N a CUDA device index)"
_FORM = re.compile(r"auto|cpu|cuda(?::(\d+))?")

_selected: str | None = None


def parse(text: Any, *, option: str = "--device") -> str:
    """``text`` checked against the forms a device option takes (not against the machine); ValueError naming
    ``option`` otherwise."""
    value = text.strip().lower() if isinstance(text, str) else None
    if value is None or _FORM.fullmatch(value) is None:
        raise ValueError(f"{option}: expected {EXPECTED}, got {text!r}")
    return value


def _torch_installed() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def resolve(text: Any = "auto", *, option: str = "--device") -> str:
    """The concrete device ``text`` names here: ``cpu`` or ``cuda:N``. ``auto``: torch's current CUDA device
    where torch sees one, else ``cpu``. ValueError naming ``option`` for a malformed value, for ``cuda`` where
    torch sees no CUDA device and for ``cuda:N`` with N past the devices it sees."""
    value = parse(text, option=option)
    if value == "cpu" or (value == "auto" and not _torch_installed()):
        return "cpu"
    if not _torch_installed():
        raise ValueError(f"{option}: {value!r} needs torch, which is not installed; expected auto or cpu here")
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if value == "auto":
        return f"cuda:{torch.cuda.current_device()}" if count else "cpu"
    if not count:
        raise ValueError(f"{option}: {value!r} asked for, but torch sees no CUDA device here "
                         "(torch.cuda.is_available() is False); expected auto or cpu")
    if value == "cuda":
        return f"cuda:{torch.cuda.current_device()}"
    index = int(value.partition(":")[2])
    if index >= count:
        raise ValueError(f"{option}: expected cuda:N with N below {count} (torch sees {count} CUDA "
                         f"device{'s' * (count != 1)}), got {text!r}")
    return value


def select(text: Any = "auto", *, option: str = "--device") -> str:
    """Make the device ``text`` names (:func:`resolve`) this process's selection; returns it."""
    global _selected
    _selected = resolve(text, option=option)
    return _selected


def selected() -> str:
    """This process's device (``cpu``, ``cuda:N``): the one selected, else ``auto``'s."""
    global _selected
    if _selected is None:
        _selected = resolve("auto")
    return _selected


@contextlib.contextmanager
def using(text: Any, *, option: str = "device") -> Iterator[str]:
    """The device ``text`` names selected for the block (``check_kernel(device=...)``), the previous one after."""
    global _selected
    before = _selected
    try:
        yield select(text, option=option)
    finally:
        _selected = before


def on_cuda() -> bool:
    """Whether the selected device is a CUDA device."""
    return selected().startswith("cuda")


def torch_device() -> Any:
    """The selected device as a ``torch.device``."""
    import torch

    return torch.device(selected())


def place(x: Any) -> Any:
    """A torch tensor (or a tuple of them, e.g. codes and scales) on the selected device; anything else as is."""
    if isinstance(x, tuple):
        return type(x)(*(place(v) for v in x)) if hasattr(x, "_fields") else tuple(place(v) for v in x)
    if type(x).__module__.startswith("torch") and hasattr(x, "to"):
        return x.to(torch_device())
    return x


#: ``madvise(2)`` advice: no transparent huge pages in the range (Linux's value on every architecture torch builds for)
_MADV_NOHUGEPAGE = 15


def reserve(elements: int, dtype: Any) -> Any:
    """An uninitialised torch tensor of ``elements`` on the selected device whose pages are committed only where
    written: the address space of the large mode's strided cells (gigabytes, a few MiB of it touched).

    On a Linux CPU its pages are advised ``MADV_NOHUGEPAGE``: where transparent huge pages are ``always``, each
    element written would otherwise commit a 2 MiB page (measured: 90 elements 2**26 apart, 182 MiB against 0.4)."""
    import torch

    base = torch.empty(elements, dtype=dtype, device=selected())
    if base.device.type == "cpu" and sys.platform.startswith("linux"):
        _advise(base.data_ptr(), base.nbytes, _MADV_NOHUGEPAGE)  # best effort: refused, pages commit as they did
    return base


def _advise(address: int, nbytes: int, advice: int) -> bool:
    """``madvise(2)`` ``advice`` for the whole pages inside ``[address, address + nbytes)``; whether it was taken
    (False where there is no such call or it refused)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    lo, hi = -(-address // page) * page, (address + nbytes) // page * page
    if hi <= lo:
        return False
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return False
    madvise.argtypes, madvise.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return madvise(lo, hi - lo, advice) == 0


def synchronize() -> None:
    """Wait for the selected CUDA device's queued work (a no-op on the CPU): a kernel's asynchronous error is
    raised, and its output complete, before it is judged."""
    if on_cuda() and "torch" in sys.modules:
        import torch

        torch.cuda.synchronize(torch_device())


def cpu_only(selection: str | None = None) -> bool:
    """Whether torch's CPU path runs (the selected device, or ``selection``, is the CPU): the refusals that are
    about torch's CPU kernels apply only then."""
    return (selection or selected()) == "cpu"


def cuda_only(what: str) -> str | None:
    """The reason a CUDA-only kernel (``what``) cannot run on the selected device, or None on a CUDA device."""
    if on_cuda():
        return None
    return f"{what} runs on CUDA devices only; the selected device is {selected()} (--device)"


def jax_device() -> str:
    """jax's default device as ``cpu``, ``cuda:0``, ``tpu:0`` (imports jax); ``none`` where jax is not installed."""
    try:
        import jax
    except ImportError:
        return "none"
    try:
        d = jax.devices()[0]
    except Exception:  # noqa: BLE001 - no backend at all
        return "none"
    platform = "cuda" if d.platform == "gpu" else d.platform
    return "cpu" if platform == "cpu" else f"{platform}:{d.id}"


def of(adapter: Any) -> str:
    """The device ``adapter``'s kernel runs on: the selected one for a torch convention, jax's default device for
    a jax one."""
    framework = adapter.convention_facts.framework
    return selected() if framework == "torch" else jax_device()
