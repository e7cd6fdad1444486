"""NumPy <-> jax / torch conversion, exact for bfloat16 (no float32 round trip).

:func:`to_framework` turns a convention's NumPy arguments into what a kernel
of that framework receives: arrays become jax arrays or torch tensors (torch
keeps the strides), dtypes become torch dtypes, gmm_ref's
``RaggedDotDimensionNumbers`` become jax's. Imports jax and torch only inside
the functions that need them.

torch tensors are made on the selected device (``gmm_kernels.sandbox.device``): on the
CPU they share the NumPy array's memory; on a CUDA device they are copies
(:func:`device_copy`: a view into a wider buffer travels with the whole buffer,
margins included, and is the same view there). Inside :func:`written_back`,
what the device copies hold after the call is copied back into their NumPy
arrays, so that a kernel's writes to its inputs are seen there as on the CPU
(``gmm_kernels.sandbox.inputs``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np

from gmm_kernels.sandbox import device as _device
from gmm_kernels.sandbox import recycle
from gmm_ref import RaggedDotDimensionNumbers

__all__ = [
    "device_array",
    "device_copy",
    "jax_group_offset",
    "jax_x64",
    "lax_dimension_numbers",
    "to_framework",
    "to_jax",
    "to_torch",
    "torch_dtype",
    "uses_64bit",
    "written_back",
]

_BF16 = np.dtype(ml_dtypes.bfloat16)
#: one-byte ml_dtypes -> the torch dtype of the same name
_TORCH_BYTE_DTYPES = {"float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2",
                      "float8_e8m0fnu": "float8_e8m0fnu"}


def torch_dtype(dt: Any) -> Any:
    """The torch dtype of a NumPy dtype (None stays None)."""
    import torch

    if dt is None:
        return None
    dt = np.dtype(dt)
    if dt == _BF16:
        return torch.bfloat16
    if str(dt) in _TORCH_BYTE_DTYPES:
        return getattr(torch, _TORCH_BYTE_DTYPES[str(dt)])
    return torch.from_numpy(np.zeros(0, dt)).dtype


def to_torch(x: Any, device: Any = None) -> Any:
    """A NumPy array as a torch tensor with the same strides (bfloat16 bit-exact) on ``device`` (default: the
    selected one, ``gmm_kernels.sandbox.device``): on the CPU sharing the array's memory, elsewhere :func:`device_copy`.
    A tensor passes through as it is."""
    import torch

    if x is None or isinstance(x, torch.Tensor):
        return x
    where = torch.device(_device.selected() if device is None else device)
    a = np.asarray(x)
    if where.type != "cpu":
        return device_copy(a, where)
    return _cpu_tensor(a)


def _cpu_tensor(a: np.ndarray) -> Any:
    """``a`` as a CPU tensor sharing its memory (a copy for negative strides, which torch lacks)."""
    import torch

    if a.size == 0:  # NumPy's strides of an empty array are arbitrary; torch checks them
        return torch.empty(a.shape, dtype=torch_dtype(a.dtype))
    if any(s < 0 for s in a.strides):
        a = a.copy()
    if a.dtype == _BF16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if str(a.dtype) in _TORCH_BYTE_DTYPES:  # float8 codes and scales: their bytes, reinterpreted
        return torch.from_numpy(a.view(np.uint8)).view(torch_dtype(a.dtype))
    return torch.from_numpy(a)


#: the device copies made inside :func:`written_back`: id of a NumPy buffer -> (its bytes, their device copy)
_copies: list[dict[int, tuple[np.ndarray, Any]]] = []


def _owner(a: np.ndarray) -> np.ndarray:
    owner = a
    while isinstance(owner.base, np.ndarray):
        owner = owner.base
    return owner


def _bytes_of(owner: np.ndarray) -> np.ndarray | None:
    """A contiguous buffer's bytes as a flat uint8 view of its memory (None for one that is not contiguous)."""
    if owner.flags.c_contiguous:
        return owner.reshape(-1).view(np.uint8)
    if owner.flags.f_contiguous:
        return owner.T.reshape(-1).view(np.uint8)
    return None


def device_copy(a: np.ndarray, device: Any) -> Any:
    """``a`` as a torch tensor on ``device`` with the same memory layout: the whole buffer ``a`` is a view of (a
    wider allocation: guard margins, a slice, a chunk of a split) copied there, and the same view (shape,
    strides, offset) taken of the copy, so that what lies around ``a`` travels with it. Inside
    :func:`written_back`, views of one buffer share one device copy, as they share memory on the host. A view
    the device cannot take the same way (negative strides, a view of another item size) is copied alone."""
    import torch

    device = torch.device(device)
    dtype = torch_dtype(a.dtype)
    if a.size == 0:
        return torch.empty(a.shape, dtype=dtype, device=device)
    owner = _owner(a)
    raw = _bytes_of(owner)
    item = a.dtype.itemsize
    offset = a.__array_interface__["data"][0] - owner.__array_interface__["data"][0]
    if raw is None or any(s < 0 or s % item for s in a.strides) or offset % item or raw.size % item:
        return _cpu_tensor(np.array(a, copy=True, order="K")).to(device)
    shared = _copies[-1] if _copies else None
    key = (id(owner), str(device))
    pool = recycle.pool()  # calls that get the same device buffers, new contents copied in
    if shared is not None and key in shared:
        buf = shared[key][1]
    elif pool is not None and ("device", *key) in pool and pool["device", *key][0] is owner:
        buf = pool["device", *key][1]
        buf.copy_(torch.from_numpy(raw))
    else:
        buf = torch.from_numpy(raw).to(device, copy=True)  # a copy on the CPU too (a test device)
        if pool is not None:
            pool["device", *key] = (owner, buf)
    if shared is not None:
        shared[key] = (raw, buf)
    return torch.as_strided(buf.view(dtype), a.shape, [s // item for s in a.strides], offset // item)


@contextlib.contextmanager
def written_back() -> Iterator[None]:
    """The device copies :func:`device_copy` makes in the block, copied back into their NumPy buffers when it
    ends (after the device's queued work is done): the host arrays then hold what the kernel left in the device
    tensors it was given, as on the CPU, where they share memory. Read-only buffers are left as they are."""
    _copies.append({})
    try:
        yield
        made = _copies[-1]
        if made:
            _device.synchronize()
        for raw, buf in made.values():
            if raw.flags.writeable:
                raw[...] = buf.cpu().numpy()
    finally:
        _copies.pop()


def to_jax(x: Any) -> Any:
    """NumPy arrays to jax arrays (None and non-arrays pass through)."""
    if isinstance(x, np.ndarray):
        return device_array(x)
    return x


def device_array(x: Any) -> Any:
    """``x`` as a jax array. A NumPy array goes through ``jax.device_put``: ``jnp.asarray`` of one
    runs an identity program (``jit(stage)``) that jax compiles once per shape and dtype, about 12 ms
    a new shape and as many compilations as the kernel's own. Anything else goes through ``jnp.asarray``
    (a Python scalar stays weakly typed)."""
    import jax

    if isinstance(x, np.ndarray):
        return jax.device_put(x)
    import jax.numpy as jnp

    return jnp.asarray(x)


def lax_dimension_numbers(dn: Any) -> Any:
    """A ``gmm_ref.RaggedDotDimensionNumbers`` (or any 3-field tuple) as the lax type."""
    from jax import lax

    if isinstance(dn, lax.RaggedDotDimensionNumbers):
        return dn
    (lc, rc), (lb, rb) = dn[0]

    def ints(xs: Any) -> tuple[int, ...]:
        return tuple(int(x) for x in xs)

    return lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=((ints(lc), ints(rc)), (ints(lb), ints(rb))),
        lhs_ragged_dimensions=ints(dn[1]),
        rhs_group_dimensions=ints(dn[2]),
    )


def jax_group_offset(go: Any) -> Any:
    """A group offset as megablox-style kernels need it: a ()-shaped int32 jax array (or None).

    megablox ``gmm`` raises for any other shape, and ``tgmm`` fails inside its
    index maps for a (1,)-shaped one.
    """
    if go is None:
        return None
    return device_array(np.asarray(go, np.int32).reshape(()))


def _to_jax_value(v: Any) -> Any:
    if isinstance(v, RaggedDotDimensionNumbers):
        return lax_dimension_numbers(v)
    if isinstance(v, tuple) and hasattr(v, "_fields"):  # a quantized operand: codes and scales
        return type(v)(*(to_jax(x) for x in v))
    return to_jax(v)


def _to_torch_value(v: Any, device: Any = None) -> Any:
    if isinstance(v, tuple) and hasattr(v, "_fields"):
        return type(v)(*(_to_torch_value(x, device) for x in v))
    if isinstance(v, np.dtype):
        return torch_dtype(v)
    if isinstance(v, np.ndarray):
        return to_torch(v) if device is None else to_torch(v, device)
    return v


def to_framework(framework: str, args: tuple, kwargs: dict, device: Any = None) -> tuple[tuple, dict]:
    """A convention's NumPy arguments as a ``framework`` ("jax" or "torch") kernel receives them; torch tensors on
    ``device`` (default: the selected one, ``gmm_kernels.sandbox.device``)."""
    if framework == "torch":
        return (tuple(_to_torch_value(a, device) for a in args),
                {k: _to_torch_value(v, device) for k, v in kwargs.items()})
    convert = {"jax": _to_jax_value}[framework]
    return tuple(convert(a) for a in args), {k: convert(v) for k, v in kwargs.items()}


def uses_64bit(*values: Any) -> bool:
    """Whether any array or dtype among ``values`` is 64-bit (needs jax x64)."""
    for v in values:
        if v is None:
            continue
        dt = None if isinstance(v, type) else getattr(v, "dtype", None)  # np.int64 has a .dtype descriptor
        if dt is None:
            try:
                dt = np.dtype(v)
            except TypeError:
                continue
        if np.dtype(dt).itemsize == 8 and np.dtype(dt).kind in "fiuc":
            return True
    return False


def jax_x64(enable: bool) -> Any:
    """A context enabling jax 64-bit types when ``enable`` (else a no-op)."""
    if not enable:
        return contextlib.nullcontext()
    import jax

    return jax.enable_x64(True)


def _walk(jaxpr: Any, found: set[str]) -> None:
    for eqn in jaxpr.eqns:
        found.add(eqn.primitive.name)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else (value,):
                inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr holds its Jaxpr
                if hasattr(inner, "eqns"):
                    _walk(inner, found)


def jax_primitives(fn: Any, args: tuple, kwargs: dict) -> frozenset[str]:
    """The jax primitives ``fn(*args, **kwargs)`` binds, sub-computations included (jax arguments are traced,
    the rest is closed over); empty if it cannot be traced (a NumPy kernel, a host callback)."""
    import jax

    traced = [i for i, a in enumerate(args) if isinstance(a, jax.Array)]

    def call(*xs: Any) -> Any:
        full = list(args)
        for i, x in zip(traced, xs, strict=True):
            full[i] = x
        return fn(*full, **kwargs)

    try:
        closed = jax.make_jaxpr(call)(*[args[i] for i in traced])
    except Exception:  # noqa: BLE001 - a kernel that cannot be traced says nothing about its primitives
        return frozenset()
    found: set[str] = set()
    _walk(closed.jaxpr, found)
    return frozenset(found)
