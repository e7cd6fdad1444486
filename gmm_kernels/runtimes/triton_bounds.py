"""Every load and store of an interpreted Triton kernel checked against the tensors it was launched with.

Triton's interpreter runs a kernel on the tensors' own memory and checks no address: a load past a tensor returns
whatever lies there and a store past it overwrites a neighbour, where a GPU may fault (compute-sanitizer names it)
or, worse, read a neighbour silently. Where the read lands only in output elements the convention leaves undefined
(rows of no group), no comparison of outputs can see it. :func:`install` patches the interpreter so that each launch
records the span of every tensor argument (a view's span, not its whole storage: a guard region or the rest of a
wider buffer is outside it), and every masked-in lane of a load or store must fall inside one of them; one that does
not raises :class:`OutOfBounds` naming the argument it is nearest to and how far past it the lane is. Lanes a mask
turns off are not checked (their addresses may be anything, as on a GPU).
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Iterator
from typing import Any

__all__ = ["OutOfBounds", "as_mismatch", "install", "reported", "span"]

#: the spans of the launch running now, innermost last: (argument name, first byte, one past the last byte, shape,
#: dtype)
_LAUNCHES: list[list[tuple[str, int, int, tuple[int, ...], str]]] = []


class OutOfBounds(IndexError):
    """A masked-in lane of an interpreted Triton load or store addressed memory outside every tensor of its launch."""


def span(tensor: Any) -> tuple[int, int]:
    """(first byte, one past the last byte) of the elements a torch tensor view holds (empty: equal)."""
    if tensor.numel() == 0:
        return tensor.data_ptr(), tensor.data_ptr()
    width = tensor.element_size()
    low = sum(min(0, (n - 1) * s) for n, s in zip(tensor.shape, tensor.stride(), strict=True))
    high = sum(max(0, (n - 1) * s) for n, s in zip(tensor.shape, tensor.stride(), strict=True))
    return tensor.data_ptr() + low * width, tensor.data_ptr() + (high + 1) * width


def _spans(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, int, int, tuple[int, ...], str]]:
    """The spans of a launch's tensor arguments (in tuples too), by parameter name."""
    params = inspect.signature(fn).parameters
    try:
        named = inspect.getcallargs(fn, *args, **{k: v for k, v in kwargs.items() if k in params})
    except TypeError:
        named = {f"argument {i}": a for i, a in enumerate(args)}
    out = []

    def add(name: str, value: Any) -> None:
        if isinstance(value, tuple):
            for i, v in enumerate(value):
                add(f"{name}[{i}]", v)
        elif hasattr(value, "data_ptr") and hasattr(value, "element_size"):
            start, end = span(value)
            out.append((name, start, end, tuple(value.shape), str(value.dtype).removeprefix("torch.")))
        elif hasattr(value, "base") and hasattr(value.base, "data_ptr"):  # a tensor descriptor
            add(f"{name}.base", value.base)

    for name, value in named.items():
        add(name, value)
    return out


def _where(address: int, width: int, spans: list[tuple[str, int, int, tuple[int, ...], str]]) -> str:
    """Where ``address`` lies against the nearest tensor of the launch, in words."""
    if not spans:
        return "the launch has no tensor argument"

    def distance(s: tuple[str, int, int, tuple[int, ...], str]) -> int:
        return s[1] - address if address < s[1] else address + width - s[2]

    name, start, end, shape, dtype = min(spans, key=distance)
    what = f"{name} (a {list(shape)} {dtype} tensor)"
    far = -(-distance((name, start, end, shape, dtype)) // width)
    wrapped = " (an element offset past 2**31 - 1 wrapped in int32?)" if far >= 2**30 else ""
    if address < start:
        return f"{far} element(s) before the start of {what}{wrapped}"
    return f"{far} element(s) past the end of {what}{wrapped}"


def _checked(np: Any, access: str, ptrs: Any, mask: Any, width: int) -> None:
    if not _LAUNCHES:
        return
    spans = _LAUNCHES[-1]
    addresses = np.asarray(ptrs, dtype=np.uint64)
    if mask is not None:
        try:
            live = np.broadcast_to(np.asarray(mask, dtype=bool), addresses.shape)
        except ValueError:  # a mask of another shape: which lanes are live cannot be told, so none is blamed
            return
        addresses = addresses[live]
    addresses = addresses.reshape(-1)
    if addresses.size == 0:
        return
    inside = np.zeros(addresses.shape, bool)
    for _, start, end, _, _ in spans:
        inside |= (addresses >= np.uint64(start)) & (addresses + np.uint64(width) <= np.uint64(end))
    if inside.all():
        return
    bad = addresses[~inside]
    raise OutOfBounds(f"a Triton {access} reached memory outside every tensor of the launch: {bad.size} masked-in "
                      f"lane(s), the first {_where(int(bad[0]), width, spans)} (lanes a mask turns off are not "
                      "checked)")


def as_mismatch(exc: BaseException, kernel: str) -> Any:
    """The harness's failure for an :class:`OutOfBounds` that ``exc`` is or wraps (the interpreter re-raises it as
    ``InterpreterError``; a kernel run in a process of its own sends its text): a ``gmm_ref.Mismatch`` of kind
    ``read_out_of_bounds`` or ``wrote_out_of_bounds``, as the guard regions report one; else None."""
    import gmm_ref

    seen: BaseException | None = exc
    while seen is not None:
        text = str(seen)
        if isinstance(seen, OutOfBounds) or "OutOfBounds(" in text:
            quoted = re.search(r"OutOfBounds\((['\"])(.*)\1\)", text, re.S)
            inner = quoted.group(2) if quoted else text
            wrote = "Triton store" in inner
            return gmm_ref.Mismatch(f"kernel {kernel} {'wrote' if wrote else 'read'} out of bounds: {inner}",
                                    kind="wrote_out_of_bounds" if wrote else "read_out_of_bounds")
        seen = seen.__cause__ or seen.__context__
    return None


@contextlib.contextmanager
def reported(kernel: str) -> Iterator[None]:
    """Raise an :class:`OutOfBounds` that a call of ``kernel`` in it raised as :func:`as_mismatch`'s failure."""
    try:
        yield
    except Exception as exc:
        found = as_mismatch(exc, kernel)
        if found is None:
            raise
        raise found from exc


def install(saved: dict[str, Any]) -> None:
    """Patch the interpreter's launch, loads and stores (their originals go into ``saved``, as the other fixes'
    do, so that ``triton_interpreter.unfix`` restores them)."""
    import numpy as np
    from triton.runtime import interpreter as ti

    builder = ti.InterpreterBuilder
    saved.update({"InterpreterBuilder.create_masked_load": builder.create_masked_load,
                  "InterpreterBuilder.create_masked_store": builder.create_masked_store,
                  "GridExecutor.__call__": ti.GridExecutor.__call__})
    load, store, call = (saved["InterpreterBuilder.create_masked_load"],
                         saved["InterpreterBuilder.create_masked_store"], saved["GridExecutor.__call__"])

    def width(ptrs: Any) -> int:
        return int(np.dtype(ti._get_np_dtype(ptrs.get_element_ty())).itemsize)

    # keywords pass through: the interpreter's own callers (a tensor descriptor's load) name some of them
    def masked_load(self: Any, ptrs: Any, mask: Any, other: Any, *rest: Any, **kw: Any) -> Any:
        _checked(np, "load", ptrs.data, mask.data, width(ptrs))
        return load(self, ptrs, mask, other, *rest, **kw)

    def masked_store(self: Any, ptrs: Any, value: Any, mask: Any, *rest: Any, **kw: Any) -> Any:
        _checked(np, "store", ptrs.data, mask.data, width(ptrs))
        return store(self, ptrs, value, mask, *rest, **kw)

    def launch(self: Any, *args: Any, **kwargs: Any) -> Any:
        _LAUNCHES.append(_spans(self.fn, args, kwargs))
        try:
            return call(self, *args, **kwargs)
        finally:
            _LAUNCHES.pop()

    builder.create_masked_load = masked_load
    builder.create_masked_store = masked_store
    ti.GridExecutor.__call__ = launch
