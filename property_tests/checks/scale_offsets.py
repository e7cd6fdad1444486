"""The ``scale`` mode's ``offsets`` cell for a routed MoE kernel: flat slot offsets past 2**31 in its per-slot
output without 2**31 elements (``property_tests.checks.scale_routed``; docs/coverage.md, "Flat offsets past 2**31
without 2**31 elements").

A fused-MoE kernel stores slot ``f = token * top_k + slot`` of its per-slot output ``C [T, top_k, N]`` at
``f * stride_cm`` (vLLM's and SGLang's ``fused_moe_kernel``: ``stride_cm`` is ``C.stride(1)``, and C's first two axes
are taken as one axis of ``T * top_k`` rows). Computed in int32, that product wraps once it passes 2**31 - 1: vLLM
casts the loaded ``sorted_token_ids`` to int64 for it. With C contiguous that takes T * top_k * N > 2**31 elements
(prefill sizes); here C's rows lie :data:`ROW_STRIDE` = 2**26 elements apart, so the 64 slots of a 16-token,
top_k = 4 routing reach 63 * 2**26 (about 4.2e9), slot 32 on past 2**31, with 64 rows of N elements written. C is
the view ``[T, top_k, N]`` with strides ``(top_k * 2**26, 2**26, 1)``: a layout the convention's C may have (the
kernel reads its strides), so a kernel that ignores them fails here too.

The view lies in one torch allocation of :data:`FRONT` + 64 * 2**26 elements (12 GiB of bfloat16) of which only the
rows and their margins are touched: the pages of an allocation no one touches are not committed (Linux), so the
cell costs a few MiB and about 0.1 s of the interpreter (measured on vLLM's kernel). C starts :data:`FRONT` = 2**31
elements into it, so that an offset wrapped in int32 (at least -2**31) still lands inside the allocation: the
write is lost, not a crash (without the front part the interpreted twin segfaults). Before the call every element
of C is NaN (as the convention's C) and :data:`MARGIN` elements on either side of each row are NaN: after it, a
changed margin is a write out of bounds named by its row's token and slot, and a row the kernel did not write
stays NaN, its token, slot and expert named by the routed comparison (``gmm_ref.assert_routed_matches``).

A convention gets the cell where its kernel writes a per-slot output in place as a torch tensor
(``RoutedConvention.out_argument``, ``output="slots"``, ``framework="torch"``) and this machine can reserve the
address space (:func:`refusal` says why not).
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

import gmm_ref
from gmm_kernels import KernelAdapter
from gmm_kernels.sandbox import convert, device, guards, inputs, tamper
from gmm_ref.dtypes import as_numpy

__all__ = ["FRONT", "MARGIN", "ROW_STRIDE", "SHAPE", "check", "refusal"]

#: T x top_k: 64 slots, the flat slot 32 the first whose offset passes 2**31 - 1
SHAPE = (16, 4)
#: elements between the starts of two rows of C (``C.stride(1)``)
ROW_STRIDE = 2**26
#: elements of the allocation before C: an offset wrapped in int32 lands in it
FRONT = 2**31
#: NaN elements on either side of each row, checked after the call (a tile written past a row's end)
MARGIN = 4096


def _elements() -> int:
    t, k = SHAPE
    return FRONT + t * k * ROW_STRIDE


def refusal(adapter: KernelAdapter) -> str | None:
    """Why ``adapter`` cannot take the cell here (its convention's output, or no address space), or None."""
    conv = adapter.convention_facts
    if conv.framework != "torch" or conv.out_argument is None or conv.output != "slots":
        return (f"{adapter.convention} does not write a per-slot [T, top_k, N] torch output in place (the cell "
                "strides its rows)")
    try:
        import torch
    except ImportError:  # the kernel cannot run here either; its availability says why
        return "torch is not installed: the cell's output is a torch tensor"

    try:  # reserved, not touched: committed page by page where written
        torch.empty(_elements(), dtype=torch.bfloat16, device=device.selected())
    except (RuntimeError, MemoryError) as exc:
        return f"cannot reserve {_elements() * 2 / 2**30:.0f} GiB of address space here: {str(exc).splitlines()[0]}"
    return None


def _strided(c: np.ndarray) -> tuple[Any, Any, np.ndarray]:
    """(the allocation, C's strided view in it holding ``c``, the indices of every row's margins)."""
    import torch

    t, k, n = c.shape
    base = device.reserve(_elements(), dtype=convert.torch_dtype(c.dtype))
    view = torch.as_strided(base, c.shape, (k * ROW_STRIDE, ROW_STRIDE, 1), FRONT)
    view.copy_(convert.to_torch(np.ascontiguousarray(c), device=base.device))
    starts = FRONT + np.arange(t * k, dtype=np.int64)[:, None] * ROW_STRIDE
    margins = np.concatenate([starts - MARGIN + np.arange(MARGIN), starts + n + np.arange(MARGIN)], axis=1)
    base[torch.from_numpy(margins.reshape(-1)).to(base.device)] = float("nan")
    return base, view, margins


def _margins_changed(base: Any, margins: np.ndarray, routing: gmm_ref.Routing, kernel: str) -> None:
    """``gmm_ref.Mismatch`` naming the first row (token, slot, expert) whose margins the kernel wrote."""
    import torch

    held = base[torch.from_numpy(margins.reshape(-1)).to(base.device)].reshape(margins.shape).float().cpu().numpy()
    rows = np.flatnonzero(~np.isnan(held).all(axis=1))
    if rows.size:
        f = int(rows[0])
        t, j = divmod(f, routing.top_k)
        raise gmm_ref.Mismatch(f"token {t}, slot {j} (expert {int(routing.topk_ids[t, j])}): kernel {kernel} wrote "
                               f"within {MARGIN} elements of this slot's row of C, outside it ({rows.size} rows' "
                               "margins changed)", kind="wrote_out_of_bounds")


def check(adapter: KernelAdapter, routing: gmm_ref.Routing, mode: Any = None) -> None:
    """Run ``adapter`` on ``routing`` with its output C strided as the module says, its other arguments guarded
    copies (``gmm_kernels.sandbox.guards``); ``gmm_ref.Mismatch`` naming the token, slot and expert of the first wrong
    element (or of a row written past), or for a write past another buffer or to an input."""
    __tracebackhide__ = True
    conv = adapter.convention_facts
    numerics = adapter.numerics_for(routing)
    pristine = conv.arguments(routing)
    where = list(inspect.signature(conv.parse).parameters).index(conv.out_argument)
    try:
        with tamper.sealed(routing, adapter.name), guards.call(adapter.name) as call:
            args, kwargs = inputs.fresh(*pristine, convention=conv, guard=call)
            base, c, margins = _strided(conv.out_value(*pristine))
            if where < len(args):
                args = (*args[:where], c, *args[where + 1:])
            else:
                kwargs = {**kwargs, conv.out_argument: c}
            with convert.written_back():
                returned = adapter.invoke(*args, **kwargs)
                device.synchronize()
        call.check()
        inputs.modified(adapter.name, conv, pristine, (args, kwargs))
        _margins_changed(base, margins, routing, adapter.name)
        # its output, as a plain call's (RoutedKernelAdapter.run): what it returns, else what it wrote into C
        got = as_numpy(c.cpu(), name=f"output of {adapter.name}") if returned is None else \
            as_numpy(returned, name=f"output of {adapter.name}", strict=True)
        out = conv.per_slot(got, *pristine)
        ref = adapter.reference_for(routing)  # once the kernel has returned
        gmm_ref.assert_routed_matches(out, ref, numerics=numerics, kernel=adapter.name, output=conv.output)
    except Exception as exc:
        t, k = SHAPE
        exc.add_note(f"C's rows were {ROW_STRIDE:,} elements apart (C.stride(1)): flat slot f = token * {k} + slot "
                     f"at f * {ROW_STRIDE:,}, past 2**31 - 1 from slot {-(-2**31 // ROW_STRIDE)} (token "
                     f"{-(-2**31 // ROW_STRIDE) // k}) on, up to {(t * k - 1) * ROW_STRIDE:,}: an offset computed in "
                     "int32 wraps there")
        raise
